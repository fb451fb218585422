"""WebShop: catalogue, goals, search, reward, the text env and its oracle (SPEC in ../shared/webshop)."""

from __future__ import annotations

import gzip
import json
import os
import random
import re
import subprocess
import sys
import tracemalloc
import types
from pathlib import Path

import pytest

import envhub
from envhub.error import InvalidAction
from envhub_webshop import reward as reward_mod
from envhub_webshop.analysis import analyze, tokenize
from envhub_webshop.catalog import Catalog, iter_json_array, parse_options, parse_pricing
from envhub_webshop.errors import DataNotFound, UnknownGoal
from envhub_webshop.goals import build_goals, cumulative_weights, weighted_index
from envhub_webshop.porter import stem
from envhub_webshop.reward import BuiltinNounTagger, TitleNouns, fuzz_match, fuzz_preprocess, get_reward, normalize_color, type_reward
from envhub_webshop.search import BM25Index, quantize_length
from envhub_webshop.shop import ShopSession, load_shop, parse_action

DATA = Path(os.environ["ENVHUB_WEBSHOP_DATA"])
SPEC_DIR = DATA.parent.parent / "webshop"


@pytest.fixture(scope="module")
def shop():
    return load_shop(DATA)


@pytest.fixture(scope="module")
def raw_rows():
    with gzip.open(DATA / "products_1k.jsonl.gz", "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


# ---------------------------------------------------------------------- catalogue


def test_catalog_rebuilds_every_processed_field_and_search_document(shop, raw_rows):
    catalog = shop.catalog
    assert len(catalog) == 1000
    assert [p.asin for p in catalog.products] == [r["id"] for r in raw_rows]
    for row in raw_rows:
        stored, product = row["product"], catalog[row["id"]]
        assert product.title == stored["Title"]
        assert product.description == stored["Description"]
        assert product.bullet_points == stored["BulletPoints"]
        assert product.options == stored["options"]
        assert product.attributes == stored["Attributes"]
        assert product.price_tag == stored["Price"]
        assert product.search_text == row["contents"]
    assert sum(len(p.pricing) == 2 for p in catalog.products) == 93
    assert sum(p.attributes == [] for p in catalog.products) == 185


def test_raw_prices_and_options_are_processed_as_upstream():
    assert parse_pricing("$19.99 - $27.99") == [19.99, 27.99]
    assert parse_pricing("$1,299.00") == [1299.0]
    assert parse_pricing("$5 $6 $7") == [5.0, 6.0]
    assert parse_pricing("") == [100.0] and parse_pricing(None) == [100.0]
    raw = {"Color": [{"value": " Black/White ", "image": None}, {"value": "Red", "image": None}], "Size": None}
    assert parse_options(raw) == {"color": ["black | white", "red"]}
    assert parse_options("") == {}


def test_missing_data_names_the_files_to_download_and_where(tmp_path):
    with pytest.raises(DataNotFound) as excinfo:
        Catalog.load(tmp_path)
    message = str(excinfo.value)
    assert "items_shuffle_1000.json" in message and "items_ins_v2_1000.json" in message
    assert str(tmp_path) in message and "ENVHUB_WEBSHOP_DATA" in message and "drive.google.com" in message
    with pytest.raises(DataNotFound, match="items_shuffle.json"):
        Catalog.load(tmp_path, setting="full")


def test_upstream_layout_streams_to_the_same_products(tmp_path, raw_rows, shop):
    raws = []
    for row in raw_rows[:60]:
        raw = dict(row["product"])
        raw["pricing"] = " - ".join(f"${v}" for v in raw["pricing"])  # upstream's raw price string
        raws.append(raw)
    (tmp_path / "items_shuffle_1000.json").write_text(json.dumps(raws), encoding="utf-8")
    ins = json.loads((DATA / "items_ins_v2_1000.json").read_text(encoding="utf-8"))
    (tmp_path / "items_ins_v2_1000.json").write_text(json.dumps(ins), encoding="utf-8")
    loaded = Catalog.load(tmp_path)
    assert loaded.products == shop.catalog.products[:60]
    assert [r["asin"] for r in iter_json_array(tmp_path / "items_shuffle_1000.json", chunk_size=97)] == [r["asin"] for r in raws]
    assert len(Catalog.load(tmp_path, limit=7)) == 7


def test_streaming_a_large_products_file_keeps_memory_bounded(tmp_path, raw_rows):
    path = tmp_path / "items_shuffle.json.gz"
    record = raw_rows[0]["product"]
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.write("[")
        for i in range(4_000):
            fh.write(("," if i else "") + json.dumps({**record, "asin": f"B{i:09d}"}))
        fh.write("]")
    size = 4_000 * len(json.dumps(record))
    tracemalloc.start()
    try:
        count = sum(1 for _ in iter_json_array(path, chunk_size=1 << 16))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 4_000
    assert peak < size / 10, f"streaming {size} bytes of JSON peaked at {peak} bytes"


# ---------------------------------------------------------------------- goals


def test_goals_match_the_spec_counts_order_and_example(shop):
    goals = shop.goals
    assert len(goals) == 6910
    assert len({g.asin for g in goals}) == 415
    assert [len(shop.goal_set.split(s)) for s in ("test", "eval", "train")] == [500, 1000, 5410]
    assert [(g.asin, g.goal_options) for g in goals[:5]] == [
        ("B0743JKHBV", {"size": '28" x 28"'}),
        ("B09QCP4579", {"color": "black", "size": "3x-large"}),
        ("B099WH1RTM", {"color": "turtles and african american couple", "size": "8x10 inch"}),
        ("B09LSKQF8C", {}),
        ("B09M63B87V", {"color": "xnj-tshirt334-gray", "size": "x-large"}),
    ]
    example = goals[710]
    assert example.asin == "B07NZ173GY" and example.price_upper == 50.0
    assert example.instruction_text == (
        "Find me day comfort men's sandals with rubber sole with color: light grey, and size: 13, "
        "and price lower than 50.00 dollars"
    )
    assert sum(g.weight for g in goals) == pytest.approx(80.82, abs=0.01)
    assert min(g.weight for g in goals) == pytest.approx(0.00051, abs=1e-5)
    assert max(g.weight for g in goals) == pytest.approx(0.8333, abs=1e-4)
    no_limit = [g for g in goals if g.price_upper == 1000000]
    assert len(no_limit) == 15 and all("price lower" not in g.instruction_text for g in no_limit)
    for goal in goals:
        assert shop.prices[goal.asin] < goal.price_upper


def test_goals_are_the_same_in_another_process(shop):
    code = (
        "import json,sys; from envhub_webshop.catalog import Catalog; from envhub_webshop.goals import build_goals;"
        "g=build_goals(Catalog.load(sys.argv[1]).products);"
        "print(json.dumps([[x.asin, x.price_upper, x.goal_options] for x in g.goals]))"
    )
    out = subprocess.run([sys.executable, "-c", code, str(DATA)], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "99"}).stdout
    assert json.loads(out) == [[g.asin, g.price_upper, g.goal_options] for g in shop.goals]


def test_price_seed_changes_limits_but_not_the_shuffle(shop):
    other = build_goals(shop.catalog.products, price_seed=5)
    assert [g.asin for g in other.goals] == [g.asin for g in shop.goals]
    assert [g.price_upper for g in other.goals] != [g.price_upper for g in shop.goals]


def test_weighted_sampler_reproduces_upstream_and_its_fix():
    rng = random.Random(24)
    weights = [rng.randint(0, 10) for _ in range(50)]
    cum = cumulative_weights(weights)
    assert [weighted_index(cum, rng) for _ in range(3)] == [44, 15, 36]
    # Upstream draws goal i with weight w[i-1]: with all weight on goal 0, it never returns 0.
    skewed = cumulative_weights([1.0, 0.0, 0.0])
    draws = random.Random(1)
    assert {weighted_index(skewed, draws) for _ in range(100)} == {1}
    assert {weighted_index(skewed, draws, upstream_quirks=False) for _ in range(100)} == {0}


# ---------------------------------------------------------------------- search


def test_analyzer_follows_lucene_english():
    assert tokenize("Men's cut-out sandals 12.5 d.o.n 10x50 1,000 foo_bar") == [
        "Men's", "cut", "out", "sandals", "12.5", "d.o.n", "10x50", "1,000", "foo_bar"
    ]  # fmt: skip
    assert analyze("The running shoes for MEN'S feet, and it is 12.5") == ["run", "shoe", "men", "feet", "12.5"]
    assert tokenize("商品 カタカナ") == ["商", "品", "カタカナ"]
    # Lucene's stemmer is Porter's reference C version: short words kept, -bli -> -ble, -logi -> -log.
    assert [stem(w) for w in ("us", "generalizations", "oscillators", "possibly", "archaeology", "happy")] == [
        "us", "gener", "oscil", "possibl", "archaeolog", "happi"
    ]  # fmt: skip


def test_lucene_length_quantisation():
    assert [quantize_length(n) for n in (0, 5, 23, 24, 30, 40, 100, 1000)] == [0, 5, 23, 24, 30, 40, 96, 984]


def test_bm25_scores_ranks_and_drops_non_matches():
    docs = {"d3": "red shoe", "d1": "red shoe", "d2": "blue shoe shoe shoe", "d4": "green hat"}
    index = BM25Index(list(docs), docs.values())
    hits = index.search("red shoe")
    assert [h[0] for h in hits] == ["d1", "d3", "d2"]  # equal scores: ascending id; d4 matches nothing
    n, avgdl = 4, (2 + 2 + 4 + 2) / 4

    def expected(tf, df, dl):
        idf = __import__("math").log(1 + (n - df + 0.5) / (df + 0.5))
        return idf * tf / (tf + 0.9 * (1 - 0.4 + 0.4 * dl / avgdl))

    assert hits[0][1] == pytest.approx(expected(1, 2, 2) + expected(1, 3, 2), rel=1e-6)
    assert hits[2][1] == pytest.approx(expected(3, 3, 4), rel=1e-6)
    twice = dict(index.search("shoe shoe"))
    once = dict(index.search("shoe"))
    assert twice["d2"] == pytest.approx(2 * once["d2"], rel=1e-6)
    assert index.search("nothing here") == []


def test_search_on_the_catalog_returns_at_most_50_positive_hits(shop):
    hits = shop.index.search("men's sandals rubber sole")
    assert 0 < len(hits) <= 50
    assert all(score > 0 for _, score in hits)
    assert [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)
    product = shop.catalog["B07NZ173GY"]
    assert "B07NZ173GY" in shop.search(product.title.lower())


# ---------------------------------------------------------------------- reward


def test_fuzzy_matcher_uses_thefuzz_019_preprocessing():
    assert fuzz_preprocess(("color", "light grey")) == "color    light grey"
    assert fuzz_preprocess("Caf\u00e9 black_style_99234") == "caf black_style_99234"
    assert fuzz_match("large", ("size", "x-large"))
    assert fuzz_match("5-5.5", ("size", "7.5"))
    assert not fuzz_match("black", ("color", "white"))
    assert not fuzz_match("", "anything")


def test_colour_normaliser_is_substring_for_text_and_equality_for_pairs():
    assert normalize_color("rectangular") == "tan"
    assert normalize_color("228blue") == "blue"
    assert normalize_color("light grey") == "grey"
    assert normalize_color(("color", "light grey")) == ("color", "light grey")
    assert normalize_color(("color", "black")) == "black"


def test_goal_product_with_goal_options_wins_6452_goals_or_all_without_quirks(shop):
    lost = {True: [], False: []}
    for quirks in (True, False):
        for i, goal in enumerate(shop.goals):
            total, _ = get_reward(shop.catalog[goal.asin], goal, shop.prices[goal.asin], dict(goal.goal_options), shop.nouns, quirks)
            if total != 1.0:
                lost[quirks].append(i)
    assert len(lost[True]) == 458 and lost[False] == []
    assert len({shop.goals[i].asin for i in lost[True]}) == 17
    assert sum(i < 500 for i in lost[True]) == 20 and sum(500 <= i < 1500 for i in lost[True]) == 72


def test_reward_parts_and_details(shop):
    goal = shop.goals[710]
    product = shop.catalog[goal.asin]
    full, details = get_reward(product, goal, shop.prices[goal.asin], {"color": "light grey", "size": "13"}, shop.nouns)
    assert full == 1.0
    assert set(details) >= {"r_type", "r_att", "w_att", "query_match", "category_match", "title_score",
                            "r_option", "w_option", "r_price", "w_price", "title_tagger"}
    no_options, _ = get_reward(product, goal, shop.prices[goal.asin], {}, shop.nouns)
    denom = len(goal.attributes) + 2 + 1
    assert no_options == pytest.approx((len(goal.attributes) + 1) / denom)
    too_dear, info = get_reward(product, goal, goal.price_upper + 1, {"color": "light grey", "size": "13"}, shop.nouns)
    assert info["r_price"] is False and too_dear == pytest.approx((denom - 1) / denom)
    other = next(p for p in shop.catalog.products if p.category != product.category)
    assert get_reward(other, goal, 10.0, {}, shop.nouns)[0] < 0.5


def test_type_reward_ladder(shop):
    goal = shop.goals[710]
    base = shop.catalog[goal.asin]
    stranger = types.SimpleNamespace(**{**{f: getattr(base, f) for f in ("title", "product_category")}, "query": "zzz"})
    stranger.product_category = "A › B"

    def tagger_for(nouns_by_title):
        return lambda title: nouns_by_title[title]

    assert type_reward(stranger, goal, tagger_for({base.title: ["sandal", "men"]}))["r_type"] == 1.0
    half = {base.title: ["a", "b", "c", "d", "e"]}
    stranger.title = "other"
    half["other"] = ["a"]
    assert type_reward(stranger, goal, tagger_for(half))["r_type"] == 0.5  # title_score 0.2, nothing else matches
    half["other"] = []
    assert type_reward(stranger, goal, tagger_for(half))["r_type"] == 0.0
    ten = {base.title: [str(i) for i in range(11)], "other": ["0"]}
    assert type_reward(stranger, goal, tagger_for(ten))["r_type"] == 0.1


def test_builtin_tagger_keeps_title_nouns_and_spacy_is_used_when_present(monkeypatch):
    nouns = BuiltinNounTagger()("FitFlop Men's Hollis Neoprene Sport Sandal for the Beach, 2 Pack")
    assert nouns == ["fitflop", "men", "hollis", "neoprene", "sport", "sandal", "beach", "pack"]

    class FakeToken:
        def __init__(self, text, pos):
            self.text, self.pos_ = text, pos

    fake = types.ModuleType("spacy")
    fake.load = lambda model: (lambda text: [FakeToken(w, "NOUN" if w[0].isupper() else "ADP") for w in text.split()])
    monkeypatch.setitem(sys.modules, "spacy", fake)
    reward_mod.get_tagger.cache_clear()
    try:
        tagger = reward_mod.get_tagger("auto")
        assert tagger.name == "spacy:en_core_web_sm"
        assert TitleNouns(tagger)("Red Shoes for Men") == ["red", "shoes", "men"]
    finally:
        reward_mod.get_tagger.cache_clear()


# ---------------------------------------------------------------------- pages and observations


def _examples() -> dict[str, dict[str, object]]:
    text = (SPEC_DIR / "observation_examples.txt").read_text(encoding="utf-8")
    sections = {}
    for block in text.split("===== ")[1:]:
        name, _, body = block.partition("\n")
        page_text = body.split("TEXT: ", 1)[1].split("\nRICH:\n", 1)[0]
        rich = body.split("\nRICH:\n", 1)[1].rsplit("CLICK: ", 1)[0]
        clicks = json.loads(body.rsplit("CLICK: ", 1)[1].strip().replace("'", '"'))
        sections[name] = {"text": page_text, "rich": rich, "clicks": clicks}
    return sections


def test_pages_render_exactly_as_the_spec_examples(shop):
    from envhub_webshop.render import observe

    examples = _examples()
    session = ShopSession(shop, shop.goals[710], 710)
    shown = {1: ["B008QYOGZ2", "B07NZ173GY", "B0989VY7D8"], 2: ["B008QYOGZ2"]}
    session.hits = lambda: ["X"] * 50
    session.page_hits = lambda: shown.get(session.results_page, [])

    def check(name, rich_visited=None):
        example = examples[name]
        assert observe(session, "text") == example["text"], name
        if rich_visited is not None:
            session.visited = rich_visited
        assert observe(session, "text_rich") == example["rich"], name
        assert [k for k in session.clickables()] == example["clicks"], name

    check("search")
    session.act(*parse_action("search[men's sandals]"))
    check("results", rich_visited={"B07NZ173GY"})
    session.act("click", "next >")
    check("results_p2")
    session.act("click", "< prev")
    session.act("click", "b07nz173gy")
    session.act("click", "light grey")
    check("item")
    for sub in ("description", "features", "reviews"):
        session.act("click", sub)
        check(sub)
        session.act("click", "< prev")
    assert session.options == {"color": "light grey"}
    session.act("click", "13")
    reward, done = session.act("click", "buy now")
    assert (reward, done) == (1.0, True)
    check("done")


def test_action_parsing_matches_upstreams_regex():
    assert parse_action("search[red shoes]") == ("search", "red shoes")
    assert parse_action("click[Buy Now] trailing") == ("click", "buy now")
    assert parse_action("search[a]b]") == ("search", "a]b")
    assert parse_action("search[[x]]") == ("search[", "x]")
    for bad in ("search[]", "search", "[x]", "x[]\n]"):
        with pytest.raises(InvalidAction):
            parse_action(bad)
    # Same answer as the regex itself on random strings of brackets, letters and newlines.
    pattern = re.compile(r"(.+)\[(.+)\]")
    rng = random.Random(0)
    for _ in range(3000):
        text = "".join(rng.choice("ab[] \n") for _ in range(rng.randint(0, 12)))
        match = pattern.match(text)
        if match is None:
            with pytest.raises(InvalidAction):
                parse_action(text)
        else:
            assert parse_action(text) == (match.group(1), match.group(2).lower()), repr(text)


# ---------------------------------------------------------------------- the text env


def test_registered_ids_splits_and_reset(shop):
    sizes = {"webshop/WebShop-v0": 5410, "webshop/WebShopEval-v0": 1000, "webshop/WebShopTest-v0": 500}
    for env_id, size in sizes.items():
        env = envhub.make(env_id)
        assert env.max_turns == 15 and len(env.goal_indices) == size
    env = envhub.make("webshop/WebShopTest-v0")
    obs, info = env.reset(seed=3)
    again, info2 = envhub.make("webshop/WebShopTest-v0").reset(seed=3)
    assert obs == again and info["goal_index"] == info2["goal_index"] < 500
    assert info["title_tagger"] in ("builtin", "spacy:en_core_web_sm")
    assert obs.startswith("WebShop [SEP] Instruction: [SEP] ") and "\nAvailable actions: search[<your query>]" in obs
    obs, info = env.reset(options={"goal": 7})
    assert info["goal_index"] == 7
    obs, info = envhub.make("webshop/WebShopEval-v0").reset(options={"goal_index": 710})
    assert "light grey" in obs
    with pytest.raises(UnknownGoal):
        env.reset(options={"goal_index": 710})
    quiet = envhub.make("webshop/WebShopTest-v0", show_actions=False)
    assert "Available actions" not in quiet.reset(seed=0)[0]


def test_weighted_goal_sampling_is_seeded():
    env = envhub.make("webshop/WebShop-v0", goal_sampling="weighted")
    first = [env.reset(seed=s)[1]["goal_index"] for s in range(20)]
    assert first == [env.reset(seed=s)[1]["goal_index"] for s in range(20)]
    assert len(set(first)) > 10


def test_a_full_episode_buys_and_reports_details():
    env = envhub.make("webshop/WebShopEval-v0", observation_mode="text_rich")
    env.reset(options={"goal_index": 710})
    steps = 0
    while True:
        obs, reward, terminated, truncated, info = env.step(env.expert_action())
        steps += 1
        if terminated or truncated:
            break
    assert terminated and reward == 1.0 and info["success"] and steps <= 10
    assert info["reward_details"]["r_type"] == 1.0 and info["purchased"] == "B07NZ173GY"
    assert "Your score (min 0.0, max 1.0)\n1.0\n" in obs


def test_history_prefix_as_upstream():
    env = envhub.make("webshop/WebShopEval-v0", num_prev_obs=1, num_prev_actions=1, show_actions=False)
    first, _ = env.reset(options={"goal_index": 710})
    obs, *_ = env.step("search[sandals]")
    assert obs.startswith(first + " [SEP] search[sandals] [SEP] Instruction:")


@pytest.mark.parametrize(
    "action",
    ["search[]", "click[nonexistent]", "x" * (1 << 20), "search[" * 100_000, "[" * 1000 + "]" * 1000,
     "Search[shoes]", "click[search]", "🛒 购物 click[🧦]", "search[[shoes]]", "click[< prev]", "\n"],
    ids=["empty-search", "unknown-click", "1MB", "open-brackets", "brackets", "capitalised", "click-search",
         "unicode", "nested", "prev-on-search", "newline"],
)  # fmt: skip
def test_malformed_actions_are_invalid_with_an_explanation(action):
    env = envhub.make("webshop/WebShopTest-v0")
    before, _ = env.reset(seed=1)
    key = env.state_key()
    obs, reward, terminated, truncated, info = env.step(action)
    assert info["action_is_valid"] is False and reward == 0 and not terminated
    assert obs.startswith("Invalid action: ") and obs.endswith(before) and info["invalid_reason"]
    assert env.state_key() == key


def test_unicode_search_is_a_valid_action():
    env = envhub.make("webshop/WebShopTest-v0")
    env.reset(seed=1)
    obs, _, _, _, info = env.step("search[🧦 socks 靴下]")
    assert info["action_is_valid"] and "Page 1 (Total results:" in obs


def test_rich_mode_state_key_tracks_visited_links():
    env = envhub.make("webshop/WebShopEval-v0", observation_mode="text_rich")
    env.reset(options={"goal_index": 710})
    env.step("search[fitflop men's hollis neoprene sport sandal]")
    key_before = env.state_key()
    env.step("click[B07NZ173GY]")
    env.step("click[< prev]")
    assert env.state_key() != key_before and "[clicked button] B07NZ173GY" in env.render()


@pytest.mark.slow
def test_oracle_wins_every_winnable_goal_of_all_three_splits():
    for quirks, expected_wins in ((True, 6452), (False, 6910)):
        env = envhub.make("webshop/WebShop-v0", split="all", upstream_quirks=quirks)
        wins = 0
        for i in env.goal_indices:
            env.reset(options={"goal_index": i})
            while True:
                action = env.expert_action()
                legal = env.valid_actions()
                assert action.startswith("search[") if legal is None else action in legal
                _, reward, terminated, truncated, info = env.step(action)
                assert info["action_is_valid"], (i, action)
                if terminated or truncated:
                    break
            assert terminated, f"goal {i}: the oracle ran out of turns"
            wins += info["success"]
        assert wins == expected_wins


def test_valid_actions_never_hand_out_the_goal_search():
    env = envhub.make("webshop/WebShopTest-v0")
    env.reset(seed=0)
    assert env.valid_actions() is None  # the search page takes free text
    obs, *_ = env.step(env.expert_action())
    legal = env.valid_actions()
    assert legal and all(a.startswith("click[") for a in legal)


def test_attributes_page_when_asked_for(shop):
    env = envhub.make("webshop/WebShopEval-v0", show_attrs=True, show_actions=False)
    env.reset(options={"goal_index": 710})
    env.step("search[fitflop men's hollis neoprene sport sandal]")
    obs, *_ = env.step("click[b07nz173gy]")
    assert obs.endswith("[SEP] Description [SEP] Features [SEP] Reviews [SEP] Attributes [SEP] Buy Now")
    obs, *_ = env.step("click[attributes]")
    product = shop.catalog["B07NZ173GY"]
    tail = " [SEP] ".join([*product.attributes, product.category, product.query, product.product_category])
    assert obs.endswith("< Prev [SEP] " + tail) and env.render() == obs
    plain = envhub.make("webshop/WebShopEval-v0", show_actions=False)
    plain.reset(options={"goal_index": 710})
    plain.step("search[fitflop men's hollis neoprene sport sandal]")
    obs, *_ = plain.step("click[b07nz173gy]")
    assert obs.endswith("[SEP] Reviews [SEP] Buy Now")
    assert not plain.step("click[attributes]")[4]["action_is_valid"]


def test_bm25_index_agrees_with_a_direct_computation_on_the_catalog(shop):
    import math
    from collections import Counter

    products = shop.catalog.products
    docs = [Counter(analyze(p.search_text)) for p in products]
    lengths = [sum(d.values()) for d in docs]
    n, avgdl = len(docs), sum(lengths) / len(docs)
    df = Counter(term for d in docs for term in d)
    for goal in shop.goals[:: len(shop.goals) // 25]:
        query = goal.instruction_text.lower()
        terms = Counter(analyze(query))
        expected = []
        for p, doc, dl in zip(products, docs, lengths):
            score = 0.0
            for term, count in terms.items():
                if doc[term]:
                    idf = math.log(1 + (n - df[term] + 0.5) / (df[term] + 0.5))
                    score += count * idf * doc[term] / (doc[term] + 0.9 * (1 - 0.4 + 0.4 * quantize_length(dl) / avgdl))
            if score > 0:
                expected.append((p.asin, score))
        expected.sort(key=lambda hit: (-hit[1], hit[0]))
        got = shop.index.search(query)
        assert len(got) == min(50, len(expected))
        assert [s for _, s in got] == pytest.approx([s for _, s in expected[: len(got)]], rel=1e-5)
        for (asin, score), (want, want_score) in zip(got, expected):
            # The order is the same except where float32 rounding swaps a near-tie.
            assert asin == want or math.isclose(score, want_score, rel_tol=1e-5)


def test_long_queries_bound_the_search_cache_and_the_state_key(monkeypatch):
    from envhub_webshop import shop as shop_module
    from envhub_webshop.env import STATE_KEY_QUERY_CHARS

    env = envhub.make("webshop/WebShop-v0")
    env.reset(seed=0)
    shop = env.shop
    monkeypatch.setattr(shop_module, "SEARCH_CACHE_CHARS", 50_000)
    shop._search_cache.clear()
    shop._search_cache_chars = 0
    for i in range(300):
        shop.search(f"shoes {i} " + "x" * 100_000)  # 300 distinct 100 KB queries
    assert shop._search_cache_chars == 0 and not shop._search_cache  # too long to cache
    for i in range(2_000):
        shop.search(f"red shoes size {i}")
    assert shop._search_cache_chars <= 50_000
    long_query = "search[" + "boots " * 20_000 + "]"
    _, _, _, _, info = env.step(long_query)
    key = env.state_key()
    assert info["action_is_valid"] and len(key) < 1_000 and "sha256:" in key
    assert len(" ".join(env.session.keywords)) > STATE_KEY_QUERY_CHARS


# ---------------------------------------------------------------------------------------- WebShopTools-v0


def _play(env, seed, to_action):
    """Play the oracle from ``seed``; return (rewards, state keys)."""
    env.reset(seed=seed)
    rewards, keys = [], []
    while True:
        _, reward, terminated, truncated, info = env.step(to_action(env))
        assert info["action_is_valid"], info
        rewards.append(reward)
        keys.append(info["state_key"])
        if terminated or truncated:
            return rewards, keys


def test_webshop_tools_is_the_same_shop_and_reward_through_tools():
    tools, text = envhub.make("webshop/WebShopTools-v0"), envhub.make("webshop/WebShop-v0")
    assert tools.valid_actions() is None and [s["function"]["name"] for s in tools.tool_schemas()] == ["search", "click", "buy"]
    for seed in range(8):
        assert _play(tools, seed, lambda env: env.expert_action()) == _play(text, seed, lambda env: env.expert_action())
    assert tools.is_success()


def test_webshop_tools_refuses_what_the_page_does_not_offer_with_the_shops_reason():
    env = envhub.make("webshop/WebShopTools-v0")
    _, info = env.reset(seed=0)
    observation, reward, terminated, _, bad = env.step('<tool_call>{"name": "buy", "arguments": {}}</tool_call>')
    assert not bad["action_is_valid"] and not terminated and reward == 0.0 and bad["state_key"] == info["state_key"]
    assert observation.startswith("Error: ") and "buy now" in observation
    *_, bad = env.step(env.call_action("click", target="no such button"))
    assert not bad["action_is_valid"] and "no such button" in bad["invalid_reason"]
