"""tools/loss_stats.py: Student's t, the paired gaps' interval and its wording, against values computed apart from
it (published t tables, a numerical integral of the density, sums done by hand), and the result files it reads."""
from __future__ import annotations

import json
import math
import pathlib
import statistics
import tempfile
import unittest
from typing import Any

from . import load_script

ls = load_script("tools/loss_stats.py")

#: Two-sided 95% critical values of Student's t (0.975 quantiles) from published tables, by degrees of freedom.
T_TABLE = {1: 12.7062047, 2: 4.3026527, 3: 3.1824463, 4: 2.7764451, 5: 2.5705818, 6: 2.4469119, 9: 2.2621572,
           10: 2.2281389, 20: 2.0859634, 30: 2.0422725}


def t_density(x: float, df: int) -> float:
    c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    return math.exp(c - (df + 1) / 2 * math.log1p(x * x / df))


def simpson(f: Any, a: float, b: float, n: int = 20000) -> float:
    h = (b - a) / n
    return h / 3 * (f(a) + f(b) + sum((4 if i % 2 else 2) * f(a + i * h) for i in range(1, n)))


def stats_of(lo: float, hi: float) -> Any:
    """A GapStats with the interval [lo, hi] (the rest consistent with it)."""
    mean = (lo + hi) / 2
    return ls.GapStats({0: mean, 1: mean}, 2, mean, 1.0, 1.0, (hi - lo) / 2, lo, hi)


class StudentT(unittest.TestCase):
    def test_quantiles_match_published_tables(self) -> None:
        for df, value in T_TABLE.items():
            with self.subTest(df=df):
                self.assertAlmostEqual(ls.t_quantile(0.975, df), value, places=6)

    def test_central_probability_matches_the_integrated_density(self) -> None:
        for df in (1, 2, 3, 4, 7, 12):
            for t in (0.3, 1.0, 2.5, 6.0):
                with self.subTest(df=df, t=t):
                    self.assertAlmostEqual(ls.t_central(t, df), 2 * simpson(lambda x: t_density(x, df), 0, t),
                                           places=9)

    def test_large_df_follows_the_normal_quantile_expansion(self) -> None:
        # Cornish-Fisher: t = z + (z^3 + z) / (4 df) + (5 z^5 + 16 z^3 + 3 z) / (96 df^2) + O(df^-3)
        z = statistics.NormalDist().inv_cdf(0.975)
        for df in (200, 4001):
            expansion = z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
            self.assertAlmostEqual(ls.t_quantile(0.975, df), expansion, places=6)
        self.assertAlmostEqual(ls.t_quantile(0.95, 1), 6.3137515, places=6)  # one-sided 95%, one dof

    def test_bad_arguments_are_named(self) -> None:
        with self.assertRaisesRegex(ValueError, "df"):
            ls.t_central(1.0, 0)
        with self.assertRaisesRegex(ValueError, "p"):
            ls.t_quantile(0.4, 3)


class Gaps(unittest.TestCase):
    def test_paired_gaps_are_relative_percent_on_common_seeds(self) -> None:
        gaps = ls.paired_gaps({0: 2.02, 1: 1.98, 7: 3.0}, {0: 2.0, 1: 2.0, 2: 5.0})
        self.assertEqual(sorted(gaps), [0, 1])
        self.assertAlmostEqual(gaps[0], 1.0)
        self.assertAlmostEqual(gaps[1], -1.0)

    def test_gaps_by_config_pair_each_configuration_with_the_reference(self) -> None:
        runs = [dict(config="exact", seed=1, valid=2.0), dict(config="int4", seed=1, valid=2.04),
                dict(config="int4", seed=0, valid=1.98), dict(config="exact", seed=0, valid=2.2),
                dict(config="int4", seed=1, valid=9.0),  # the seed's first run counts
                dict(config="int8", seed=5, valid=2.0)]  # no seed in common with exact: left out
        gaps = ls.gaps_by_config(runs, "exact")
        self.assertEqual(list(gaps), ["exact", "int4"])
        self.assertEqual(gaps["exact"], {0: 0.0, 1: 0.0})
        self.assertEqual(list(gaps["int4"]), [0, 1])  # by seed
        self.assertAlmostEqual(gaps["int4"][0], 100 * (1.98 - 2.2) / 2.2)
        self.assertAlmostEqual(gaps["int4"][1], 2.0)
        self.assertEqual(ls.gaps_by_config([dict(spec="a", seed=0, valid=1.0)], "b", name="spec"), {})
        self.assertEqual(ls.gaps_by_config([dict(spec="a", seed=0, valid=1.0)], "a", name="spec"), {"a": {0: 0.0}})

    def test_interval_by_hand(self) -> None:
        # gaps 1, 2, 6: mean 3, squares of deviations 4 + 1 + 9 = 14, s^2 = 7, se = sqrt(7 / 3), t(2) = 4.3026527
        s = ls.gap_stats({0: 1.0, 1: 2.0, 2: 6.0})
        se = math.sqrt(7 / 3)
        self.assertEqual((s.n, s.seeds), (3, [0, 1, 2]))
        self.assertAlmostEqual(s.mean, 3.0)
        self.assertAlmostEqual(s.sd, math.sqrt(7))
        self.assertAlmostEqual(s.se, se)
        self.assertAlmostEqual(s.lo, 3 - 4.3026527 * se, places=6)
        self.assertAlmostEqual(s.hi, 3 + 4.3026527 * se, places=6)
        self.assertAlmostEqual(s.bound, 3 + 4.3026527 * se, places=6)
        self.assertEqual(s.sign, "none")

    def test_one_seed_has_no_interval(self) -> None:
        s = ls.gap_stats({4: 0.27})
        self.assertEqual((s.n, s.sd, s.se, s.lo, s.hi, s.bound), (1, None, None, None, None, None))
        self.assertEqual(ls.verdict(s, 0.1), "one seed: no interval")
        with self.assertRaisesRegex(ValueError, "no seed"):
            ls.gap_stats({})

    def test_verdicts(self) -> None:
        cases = [((-0.05, 0.08), "within ±0.1%"), ((-0.1, 0.1), "within ±0.1%"), ((0.11, 0.9), "more than +0.1%"),
                 ((-0.9, -0.2), "below -0.1%"), ((-0.6, 0.05), "at most +0.1%"), ((-0.05, 0.3), "cannot tell at 0.1%"),
                 ((-0.64, 0.64), "cannot tell at 0.1%"), ((0.02, 0.3), "cannot tell at 0.1%")]
        for (lo, hi), words in cases:
            with self.subTest(lo=lo, hi=hi):
                self.assertEqual(ls.verdict(stats_of(lo, hi), 0.1), words)
        self.assertEqual(stats_of(0.02, 0.3).sign, "above")
        self.assertEqual(stats_of(-0.3, -0.02).sign, "below")
        with self.assertRaisesRegex(ValueError, "tolerance"):
            ls.verdict(stats_of(0, 1), 0)

    def test_a_mean_inside_the_tolerance_is_not_enough(self) -> None:
        # The 57M model's int8-gradient gaps (RESULTS.md): mean +0.004%, far inside 0.1%, interval about +-0.64%.
        s = ls.gap_stats(dict(enumerate([0.30, -1.13, -0.07, 0.58, -0.02, 0.38])))
        self.assertLess(abs(s.mean), 0.1)
        self.assertAlmostEqual(s.hi - s.mean, 0.64, delta=0.01)
        self.assertEqual(ls.verdict(s, 0.1), "cannot tell at 0.1%")

    def test_cells_and_words(self) -> None:
        s = ls.gap_stats({0: 1.0, 1: 2.0, 2: 6.0})  # the interval by hand above: 3 -+ 4.3026527 * 1.5275
        self.assertEqual(ls.gap_cells(s), ["0,1,2", "+3.00%", "1.53", "-3.57 .. +9.57%", "+1.00 / +2.00 / +6.00"])
        self.assertEqual(ls.gap_cells(ls.gap_stats({3: 0.004})), ["3", "+0.004%", "-", "-", "+0.00"])

        def row(lo: float, hi: float, tolerance: float | None) -> Any:
            return ls.Row("c", "x", "X", "ref", tolerance, stats_of(lo, hi))

        self.assertEqual(ls.describe(row(-0.6, 0.05, 0.1)), "at most +0.1%")
        self.assertEqual(ls.describe(row(0.2, 0.9, 0.1)), "more than +0.1%")  # the verdict says the sign
        self.assertEqual(ls.describe(row(0.02, 0.3, 0.1)), "cannot tell at 0.1%; above `ref`")
        self.assertEqual(ls.describe(row(-0.3, -0.02, None)), "below `ref`")
        self.assertEqual(ls.describe(row(-0.3, 0.2, None)), "no difference resolved")
        self.assertEqual(ls.describe(ls.Row("c", "x", "X", "ref", 0.1, ls.gap_stats({0: 0.1}))),
                         "one seed: no interval")

    def test_seeds_for_half_width(self) -> None:
        for sd, h in ((0.61, 0.1), (1.0, 1.0), (0.2, 0.5)):
            n = ls.seeds_for_half_width(sd, h)
            with self.subTest(sd=sd, h=h):
                self.assertLessEqual(ls.t_quantile(0.975, n - 1) * sd / math.sqrt(n), h)
                if n > 2:
                    self.assertGreater(ls.t_quantile(0.975, n - 2) * sd / math.sqrt(n - 1), h)


class Files(unittest.TestCase):
    def write(self, folder: pathlib.Path, name: str, doc: dict[str, Any]) -> None:
        (folder / name).write_text(json.dumps(doc))

    def test_both_file_shapes_and_conflicts(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            d = pathlib.Path(tmp)
            self.write(d, "a.json", {"losses": [{"spec": "ref", "seed": 0, "valid": 2.0},
                                                {"spec": "x", "seed": 0, "valid": 2.02}]})
            self.write(d, "b.json", {"runs": [{"config": "ref", "seed": 1, "valid": 2.0},
                                              {"config": "x", "seed": 1, "valid": 1.99},
                                              {"config": "ref", "seed": 0, "valid": 2.0}]})
            self.write(d, "e.json", {"runs": [{"config": "y", "seed": 0, "valid": 2.02 * 1.1},
                                              {"config": "y", "seed": 1, "valid": 1.99 * 0.9}]})
            self.write(d, "f.json", {"runs": [{"config": "x", "seed": 9, "valid": 1.0}]})
            c = ls.Campaign("t", "test", ("a.json", "b.json", "e.json", "f.json"), "ref", {"x": ("X", 0.5)},
                            (("y", "x"),))
            rows = ls.campaign_rows(c, d)
            self.assertEqual([(r.config, r.reference) for r in rows], [("x", "ref"), ("y", "ref"), ("y", "x")])
            self.assertEqual(rows[0].stats.seeds, [0, 1])
            # the files of the runs paired (ref seed 0 from a.json, the first to hold it), and x's seed 9 unpaired
            self.assertEqual(rows[0].files, ("a.json", "b.json"))
            self.assertEqual(rows[0].unpaired, (9,))
            self.assertEqual(rows[1].files, ("a.json", "b.json", "e.json"))
            self.assertEqual(rows[2].files, ("a.json", "b.json", "e.json"))
            read = []
            loaded = ls.campaign_rows(c, d / "elsewhere", lambda name: read.append(name) or
                                      json.loads((d / name).read_text()))
            self.assertEqual(read, list(c.files))
            self.assertEqual([r.stats for r in loaded], [r.stats for r in rows])
            self.assertAlmostEqual(rows[0].stats.mean, (1.0 - 0.5) / 2)
            self.assertAlmostEqual(rows[2].stats.mean, (10.0 - 10.0) / 2)
            for seed, want in ((0, 10.0), (1, -10.0)):
                self.assertAlmostEqual(rows[2].stats.gaps[seed], want)
            self.write(d, "c.json", {"runs": [{"config": "ref", "seed": 0, "valid": 2.5}]})
            with self.assertRaisesRegex(ValueError, "ref seed 0.*a.json.*c.json"):
                ls.campaign_rows(ls.Campaign("t", "t", ("a.json", "c.json"), "ref"), d)
            self.write(d, "d.json", {"runs": [{"config": "ref", "valid": 2.5}]})
            with self.assertRaisesRegex(ValueError, "d.json.*cannot be paired"):
                ls.runs_of_file(d / "d.json")

    def test_split_by_names_runs_by_a_field_of_their_file(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            d = pathlib.Path(tmp)
            # Two settings of one configuration against the same exact runs; y, which the field does not set, keeps
            # its name and pairs across the files.
            self.write(d, "b256.json", {"grad_block_size": 256, "losses": [
                {"spec": "ref", "seed": 0, "valid": 2.0}, {"spec": "x", "seed": 0, "valid": 2.04},
                {"spec": "ref", "seed": 1, "valid": 3.0}, {"spec": "x", "seed": 1, "valid": 3.03},
                {"spec": "y", "seed": 0, "valid": 2.2}]})
            self.write(d, "b64.json", {"grad_block_size": 64, "losses": [
                {"spec": "ref", "seed": 0, "valid": 2.0}, {"spec": "x", "seed": 0, "valid": 2.02},
                {"spec": "ref", "seed": 1, "valid": 3.0}, {"spec": "x", "seed": 1, "valid": 2.97},
                {"spec": "y", "seed": 1, "valid": 3.3}]})
            a, b = "x grad_block_size=256", "x grad_block_size=64"
            c = ls.Campaign("t", "t", ("b256.json", "b64.json"), "ref", {a: ("A", 0.5), b: ("B", 0.5)}, ((b, a),),
                            split_by=("grad_block_size", ("x",)))
            rows = ls.campaign_rows(c, d)
            self.assertEqual([(r.config, r.reference) for r in rows],
                             [(a, "ref"), (b, "ref"), ("y", "ref"), (b, a)])
            self.assertEqual(rows[2].stats.seeds, [0, 1])
            self.assertAlmostEqual(rows[0].stats.gaps[0], 2.0)
            self.assertAlmostEqual(rows[1].stats.gaps[1], -1.0)
            self.assertAlmostEqual(rows[3].stats.gaps[0], 100 * (2.02 - 2.04) / 2.04)
            self.assertEqual(rows[0].files, ("b256.json",))
            # Unsplit, the two files' x runs of one seed disagree: they cannot be one configuration.
            with self.assertRaisesRegex(ValueError, "x seed 0.*b256.json.*b64.json"):
                ls.campaign_rows(ls.Campaign("t", "t", ("b256.json", "b64.json"), "ref"), d)
            # The reference's runs of a seed must still agree across the files.
            self.write(d, "b64.json", {"grad_block_size": 64, "losses": [{"spec": "ref", "seed": 0, "valid": 2.5}]})
            with self.assertRaisesRegex(ValueError, "ref seed 0"):
                ls.campaign_rows(c, d)

    def test_every_loss_file_in_the_tree_is_read_or_excused(self) -> None:
        if not ls.RESULTS.is_dir():
            raise unittest.SkipTest(f"{ls.RESULTS} not found")
        self.assertEqual(ls.check_coverage(), [])
        for c in ls.CAMPAIGNS:
            with self.subTest(campaign=c.name):
                rows = ls.campaign_rows(c)
                self.assertTrue(rows)
                for r in rows:
                    self.assertIn(r.reference, {c.reference} | {against for _, against in c.contrasts})
                    self.assertTrue(all(math.isfinite(g) for g in r.stats.gaps.values()))

    def test_the_57m_figures_quoted_in_results(self) -> None:
        if not ls.RESULTS.is_dir():
            raise unittest.SkipTest(f"{ls.RESULTS} not found")
        rows = {r.config: r for r in ls.campaign_rows(next(c for c in ls.CAMPAIGNS if c.name == "fsdp2-57m"))}
        int8 = rows["zpccl:8:8"].stats
        self.assertEqual(int8.seeds, [0, 1, 2, 3, 4, 5])
        self.assertAlmostEqual(int8.mean, 0.004, delta=0.001)
        self.assertEqual(ls.verdict(int8, 0.1), "cannot tell at 0.1%")
        self.assertEqual(ls.verdict(rows["zpccl:8:4"].stats, 0.5), "at most +0.5%")

    def test_blocks_of_64_against_256_on_the_cpu_threads(self) -> None:
        if not ls.RESULTS.is_dir():
            raise unittest.SkipTest(f"{ls.RESULTS} not found")
        rows = ls.campaign_rows(next(c for c in ls.CAMPAIGNS if c.name == "grad-cpu"))
        b64 = next(r for r in rows if r.config == "int4-b64" and r.reference == "int4")
        self.assertEqual(b64.stats.seeds, [0, 1, 2, 3])
        self.assertEqual(b64.stats.sign, "below")  # seed by seed 0.49 - 0.67% below blocks of 256


if __name__ == "__main__":
    unittest.main()
