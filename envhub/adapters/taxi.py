"""Gymnasium's Taxi as text: the map without colour codes, and the passenger and destination in words."""

from __future__ import annotations

from typing import Any

import gymnasium

#: Taxi's actions in Gymnasium's index order.
ACTION_NAMES = ("South", "North", "East", "West", "Pickup", "Dropoff")

TAXI = "T"

INSTRUCTIONS = (
    "You drive a taxi on a 5x5 grid. Pick the passenger up at their location and drop them off at "
    "their destination. The locations are the letters R, G, Y and B on the map; '|' is a wall the "
    f"taxi cannot cross, ':' is open road, and {TAXI} is the taxi. Rows are numbered 0-4 from the top "
    "and columns 0-4 from the left.\n"
    "Actions: South, North, East, West (move one square), Pickup, Dropoff.\n"
    "Rewards: -1 per move, +20 for delivering the passenger (which ends the episode), "
    "-10 for a Pickup or Dropoff where it is not allowed."
)


def observation_to_text(env: gymnasium.Env, observation: Any, terminated: bool) -> str:
    """Draw the map with the taxi, and say where the passenger and the destination are."""
    base = env.unwrapped
    row, col, passenger, destination = base.decode(int(observation))
    rows = [[c.decode("utf-8") for c in line] for line in base.desc.tolist()]
    names = [rows[1 + r][2 * c + 1] for r, c in base.locs]
    rows[1 + row][2 * col + 1] = TAXI
    here = next((names[i] for i, loc in enumerate(base.locs) if loc == (row, col)), None)
    taxi_line = f"Taxi: row {row}, column {col}" + (f" (at {here})." if here else ".")
    if terminated:
        passenger_line = f"The passenger has been delivered to {names[destination]}."
    elif passenger == len(base.locs):
        passenger_line = f"Passenger: in the taxi. Destination: {names[destination]}."
    else:
        passenger_line = f"Passenger: waiting at {names[passenger]}. Destination: {names[destination]}."
    return "\n".join(["".join(line) for line in rows] + [taxi_line, passenger_line])
