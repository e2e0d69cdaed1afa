"""fleetscope.flows.order: packed-key sorts give exactly polars' stable multi-column order."""
import numpy as np
import polars as pl

from fleetscope.flows.order import lex_order, sort_by


def _frame(n: int, seed: int) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    ips = np.array([f"10.0.{i}.{j}" for i in range(7) for j in range(9)] + ["fd00:a0::1", "fd00:a0::10"])
    s = pl.DataFrame({
        "src": ips[rng.integers(0, len(ips), n)], "dst": ips[rng.integers(0, len(ips), n)],
        "port": rng.integers(0, 70_000, n), "qp": rng.integers(0, 3, n),
        "t": rng.integers(-5, 5, n) * 1_000 + 1_795_000_000_000_000_000, "b": rng.integers(1, 4, n),
        "flag": rng.random(n) < 0.5,
    })
    # nulls in a string, an integer and a boolean key (ports of flows without them, queue pairs of TCP)
    return s.with_columns(pl.when(rng.random(n) < 0.1).then(None).otherwise(pl.col(c)).alias(c) for c in ("dst", "qp", "flag"))


def test_packed_order_equals_polars_stable_sort_with_nulls_strings_and_ties():
    for seed in range(5):
        df = _frame(5_000, seed).with_row_index("i")
        for keys in (["src", "dst", "port", "qp", "t", "b"], ["t"], ["flag", "dst", "b"], ["qp", "src"]):
            want = df.sort(keys, maintain_order=True)["i"].to_numpy()
            assert np.array_equal(df["i"].to_numpy()[lex_order(df, keys)], want), (seed, keys)
            assert sort_by(df, keys)["i"].to_list() == want.tolist()


def test_keys_wider_than_one_word_still_sort_lexicographically():
    # 64-bit timestamps over a wide range and many ports need several words
    rng = np.random.default_rng(7)
    df = pl.DataFrame({"a": rng.integers(0, 2**40, 3_000), "b": rng.integers(0, 2**40, 3_000),
                       "c": rng.integers(0, 2, 3_000)}).with_row_index("i")
    want = df.sort(["c", "a", "b"], maintain_order=True)["i"].to_list()
    assert df[lex_order(df, ["c", "a", "b"])]["i"].to_list() == want


def test_hashes_and_floats_sort_by_their_values():
    rng = np.random.default_rng(3)
    df = pl.DataFrame({"h": pl.Series(rng.integers(0, 2**63, 2_000, dtype=np.uint64) * np.uint64(2)),
                       "x": np.round(rng.normal(size=2_000), 1)}).with_row_index("i")
    assert df[lex_order(df, ["h", "x"])]["i"].to_list() == df.sort(["h", "x"], maintain_order=True)["i"].to_list()
    assert df[lex_order(df, ["x", "i"])]["i"].to_list() == df.sort(["x", "i"], maintain_order=True)["i"].to_list()
