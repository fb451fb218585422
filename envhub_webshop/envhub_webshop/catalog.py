"""The product catalogue: loading WebShop's products and instructions from disk (SPEC section 1).

Two on-disk layouts are understood, in a data directory:

- envhub's small-setting files (what ``../shared/data/webshop`` holds): ``products_1k.jsonl.gz``
  (``{"id", "contents", "product"}`` per line) and ``items_ins_v2_1000.json``;
- WebShop's own downloads: ``items_shuffle_1000.json`` + ``items_ins_v2_1000.json`` (small) or
  ``items_shuffle.json`` + ``items_ins_v2.json`` (the full 1.18M products, several GB). These are
  JSON documents that are parsed incrementally, one record at a time, so reading them needs memory
  for the records kept, never for the whole file.

Either way each raw scraped record is processed by the same rules (:func:`process_record`).
"""

from __future__ import annotations

import ast
import dataclasses
import gzip
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from envhub_webshop.errors import DataNotFound

#: Environment variable naming the data directory.
DATA_ENV = "ENVHUB_WEBSHOP_DATA"

SMALL, FULL = "small", "full"

#: Per setting: the product file candidates (first found wins) and the instructions file.
LAYOUTS: dict[str, tuple[tuple[str, ...], str]] = {
    SMALL: (("products_1k.jsonl.gz", "items_shuffle_1000.json", "items_shuffle_1000.json.gz"), "items_ins_v2_1000.json"),
    FULL: (("items_shuffle.json", "items_shuffle.json.gz"), "items_ins_v2.json"),
}

DOWNLOADS = {
    "items_shuffle_1000.json": "https://drive.google.com/uc?id=1EgHdxQ_YxqIQlvvq5iKlCrkEKR6-j0Ib",
    "items_ins_v2_1000.json": "https://drive.google.com/uc?id=1IduG0xl544V_A_jv3tHXC0kyFi7PnyBu",
    "items_shuffle.json": "https://drive.google.com/uc?id=1A2whVgOO0euk5O13n2iYDM0bQRkkRduB",
    "items_ins_v2.json": "https://drive.google.com/uc?id=1s2j6NgHljiZzQNL3veZaAiyW_qDEgBNi",
}

DEFAULT_PRICE = 100.0
_NOT_PRICE = re.compile(r"[^\d.]")


@dataclasses.dataclass(slots=True)
class Product:
    """One product as the environment shows it and the reward reads it (SPEC 1.2).

    Attributes:
        asin: Amazon id (10 characters).
        title: ``Title`` (the raw ``name``; the reward's ``name`` is the same string).
        description: ``Description``.
        bullet_points: ``BulletPoints``.
        pricing: one or two prices (a single price or a range).
        options: option name (lower-case) -> values (lower-case, ``/`` written `` | ``).
        attributes: ``Attributes`` (``["DUMMY_ATTR"]`` when the instructions file has none).
        instruction: the synthetic instruction, or None when the product yields no goals.
        instruction_attributes: the attributes that instruction asks for, or None.
        query: the search query the product was scraped under, lower-cased.
        category: one of beauty, electronics, fashion, garden, grocery (small setting).
        product_category: ``›``-separated breadcrumb.
        main_image: first image URL, or "".
    """

    asin: str
    title: str
    description: str
    bullet_points: list[str]
    pricing: list[float]
    options: dict[str, list[str]]
    attributes: list[str]
    instruction: str | None
    instruction_attributes: list[str] | None
    query: str
    category: str
    product_category: str
    main_image: str

    @property
    def price_tag(self) -> str:
        """The displayed ``Price``: ``$877.8`` or ``$26.44 to $69.99``."""
        if len(self.pricing) == 1:
            return f"${self.pricing[0]!r}"
        return f"${self.pricing[0]!r} to ${self.pricing[1]!r}"

    @property
    def search_text(self) -> str:
        """The search document (SPEC 1.4): title, description, first bullet and options, lower-cased."""
        option_text = ", and ".join(f"{name}: " + ", ".join(values) for name, values in self.options.items())
        first_bullet = self.bullet_points[0] if self.bullet_points else ""
        return " ".join([self.title, self.description, first_bullet, option_text]).lower()


def parse_pricing(raw: Any) -> list[float]:
    """Return at most two prices from a raw price string (``"$19.99 - $27.99"``) or list.

    The string is split on ``$``; every piece after the first keeps only digits and dots. A
    missing or empty price is ``[100.0]``.
    """
    if isinstance(raw, list):
        values = [float(v) for v in raw[:2]]
        return values or [DEFAULT_PRICE]
    if not raw:
        return [DEFAULT_PRICE]
    values = []
    for piece in str(raw).split("$")[1:]:
        cleaned = _NOT_PRICE.sub("", piece)
        try:
            values.append(float(cleaned))
        except ValueError:
            continue
    return values[:2] or [DEFAULT_PRICE]


def parse_options(raw: Any) -> dict[str, list[str]]:
    """Return the option dict from raw ``customization_options`` (SPEC 1.2)."""
    if isinstance(raw, str):
        raw = ast.literal_eval(raw) if raw.strip() else {}
    options: dict[str, list[str]] = {}
    for name, entries in (raw or {}).items():
        if entries is None:
            continue
        options[name.lower()] = [entry["value"].strip().replace("/", " | ").lower() for entry in entries]
    return options


def _literal_list(value: Any) -> Any:
    if isinstance(value, str) and value.startswith("[") and value.endswith("]"):
        try:
            return ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return value
    return value


def process_record(raw: dict[str, Any], ins: dict[str, Any] | None) -> Product:
    """Build a :class:`Product` from a raw scraped record and its instructions entry (SPEC 1.2)."""
    bullets = _literal_list(raw.get("small_description", ""))
    if not isinstance(bullets, list):
        bullets = [bullets]
    images = _literal_list(raw.get("images") or [])
    ins = ins or {}
    return Product(
        asin=raw["asin"],
        title=raw.get("name", ""),
        description=raw.get("full_description", ""),
        bullet_points=[str(b) for b in bullets],
        pricing=parse_pricing(raw.get("pricing")),
        options=parse_options(raw.get("customization_options")),
        attributes=list(ins["attributes"]) if "attributes" in ins else ["DUMMY_ATTR"],
        instruction=ins.get("instruction"),
        instruction_attributes=ins.get("instruction_attributes"),
        query=str(raw.get("query", "")).lower().strip(),
        category=raw.get("category", ""),
        product_category=raw.get("product_category", ""),
        main_image=images[0] if isinstance(images, list) and images else "",
    )


# ---------------------------------------------------------------------- streaming JSON


def _open_text(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def _iter_json_values(path: Path, chunk_size: int = 1 << 20) -> Iterator[tuple[str | None, Any]]:
    """Yield ``(key, value)`` for each element of a top-level JSON array (key None) or object.

    Reads ``chunk_size`` characters at a time and decodes one element at a time, so memory
    stays bounded by the largest single element, whatever the file's size.
    """
    decoder = json.JSONDecoder()
    with _open_text(path) as fh:
        buf, pos, eof = "", 0, False

        def fill() -> bool:
            nonlocal buf, pos, eof
            if eof:
                return False
            chunk = fh.read(chunk_size)
            if not chunk:
                eof = True
                return False
            buf, pos = buf[pos:] + chunk, 0
            return True

        def skip_ws() -> str:
            nonlocal pos
            while True:
                while pos < len(buf) and buf[pos] in " \t\r\n,:":
                    pos += 1
                if pos < len(buf):
                    return buf[pos]
                if not fill():
                    return ""

        def decode() -> Any:
            nonlocal pos
            while True:
                try:
                    value, end = decoder.raw_decode(buf, pos)
                except json.JSONDecodeError:
                    if not fill():
                        raise
                    continue
                # A number at the buffer's end may continue in the next chunk.
                if end == len(buf) and not eof and fill():
                    continue
                pos = end
                return value

        opening = skip_ws()
        if opening not in "[{" or not opening:
            raise ValueError(f"{path} does not hold a JSON array or object")
        pos += 1
        closing = "]" if opening == "[" else "}"
        while True:
            ch = skip_ws()
            if ch == closing:
                return
            if not ch:
                raise ValueError(f"{path} ends before its closing {closing!r}")
            key = decode() if opening == "{" else None
            skip_ws()
            yield key, decode()


def iter_json_array(path: str | os.PathLike[str], chunk_size: int = 1 << 20) -> Iterator[Any]:
    """Yield the elements of the JSON array in ``path`` (``.json`` or ``.json.gz``) one by one,
    reading ``chunk_size`` characters at a time."""
    for _, value in _iter_json_values(Path(path), chunk_size):
        yield value


def iter_json_object(path: str | os.PathLike[str]) -> Iterator[tuple[str, Any]]:
    """Yield the ``(key, value)`` pairs of the JSON object in ``path`` one by one."""
    for key, value in _iter_json_values(Path(path)):
        yield key, value  # type: ignore[misc]


def iter_raw_records(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Yield raw product records from a products file of either layout, streaming."""
    path = Path(path)
    if path.name.endswith((".jsonl", ".jsonl.gz")):
        with _open_text(path) as fh:
            for line in fh:
                if line.strip():
                    yield json.loads(line)["product"]
    else:
        yield from iter_json_array(path)


# ---------------------------------------------------------------------- the catalogue


def default_data_dir() -> Path:
    """``$ENVHUB_WEBSHOP_DATA``, else ``$XDG_CACHE_HOME/envhub/webshop`` (``~/.cache/...``)."""
    configured = os.environ.get(DATA_ENV)
    if configured:
        return Path(configured).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "envhub" / "webshop"


def _missing_message(directory: Path, setting: str, missing: str) -> str:
    products, ins = LAYOUTS[setting]
    upstream_products = products[1] if setting == SMALL else products[0]
    return (
        f"WebShop data not found: {missing} is missing in {directory}. "
        f"Download {upstream_products} ({DOWNLOADS[upstream_products]}) and {ins} ({DOWNLOADS[ins]}) "
        f"from the WebShop project (github.com/princeton-nlp/WebShop, setup.sh) into {directory}, "
        f"or point {DATA_ENV} (or data_dir=) at a directory that has them."
    )


def find_data_files(data_dir: str | os.PathLike[str] | None = None, setting: str = SMALL) -> tuple[Path, Path]:
    """Return the ``(products, instructions)`` files of ``setting`` in ``data_dir``.

    Raises:
        DataNotFound: naming the files to download and where to put them.
    """
    if setting not in LAYOUTS:
        raise ValueError(f"setting must be one of {sorted(LAYOUTS)}, got {setting!r}")
    directory = Path(data_dir).expanduser() if data_dir is not None else default_data_dir()
    candidates, ins_name = LAYOUTS[setting]
    products = next((directory / name for name in candidates if (directory / name).is_file()), None)
    if products is None:
        raise DataNotFound(_missing_message(directory, setting, " / ".join(candidates)))
    ins = directory / ins_name
    if not ins.is_file():
        raise DataNotFound(_missing_message(directory, setting, ins_name))
    return products, ins


def _keep(asin: Any, seen: set[str]) -> bool:
    return isinstance(asin, str) and asin != "nan" and len(asin) <= 10 and asin not in seen


class Catalog:
    """Products in file order, by position and by asin.

    Args:
        products: the products, in the order that drives goal generation.
    """

    def __init__(self, products: list[Product]):
        self.products = products
        self.by_asin = {p.asin: p for p in products}

    def __len__(self) -> int:
        return len(self.products)

    def __getitem__(self, asin: str) -> Product:
        return self.by_asin[asin]

    def __contains__(self, asin: object) -> bool:
        return asin in self.by_asin

    @classmethod
    def load(
        cls, data_dir: str | os.PathLike[str] | None = None, *, setting: str = SMALL, limit: int | None = None
    ) -> Catalog:
        """Load a catalogue from ``data_dir`` (default: :func:`default_data_dir`).

        Args:
            data_dir: a directory with one of the layouts in the module docstring.
            setting: ``"small"`` (1,000 products) or ``"full"`` (1.18M products).
            limit: keep only the first ``limit`` products.

        Raises:
            DataNotFound: when the files are not there, naming what to download and where.
        """
        products_path, ins_path = find_data_files(data_dir, setting)
        ins = dict(iter_json_object(ins_path))
        products: list[Product] = []
        seen: set[str] = set()
        for raw in iter_raw_records(products_path):
            if limit is not None and len(products) >= limit:
                break
            asin = raw.get("asin")
            if not _keep(asin, seen):
                continue
            seen.add(asin)
            products.append(process_record(raw, ins.get(asin)))
        return cls(products)
