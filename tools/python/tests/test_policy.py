"""zpccl.ZeroPlusPlusPolicy: checked once when made, at the library's bounds (zpccl.enums), each refusal naming the
argument; frozen; resolve_policy, which integrations' entry points use to take a policy or its fields as keyword
arguments; and what the integrations' sessions share (zpccl._session): the policy read through the session, the
hpZ group rule; the scripts' quantization options, which default to the policy's. Needs neither torch nor the
library."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import logging
import unittest

import zpccl
from zpccl import enums
from zpccl._policy import resolve_policy
from zpccl._report import Report
from zpccl._session import Session, hpz_group_problem, refuse_hpz_group

from . import load_script

Policy = zpccl.ZeroPlusPlusPolicy


class PolicyChecks(unittest.TestCase):
    def refused(self, words: str, **fields: object) -> None:
        with self.assertRaises(zpccl.ZpcclError) as caught:
            Policy(**fields)
        self.assertIn(words, caught.exception.message)
        self.assertTrue(caught.exception.message.startswith("ZeroPlusPlusPolicy: "), caught.exception.message)

    def test_defaults_are_valid_and_frozen(self) -> None:
        p = Policy()
        self.assertEqual((p.weight_bits, p.grad_bits, p.block_size, p.grad_block), (8, 4, 256, 256))
        with self.assertRaises(dataclasses.FrozenInstanceError):
            p.block_size = 64  # type: ignore[misc]
        q = dataclasses.replace(p, grad_block_size=64)
        self.assertEqual((q.block(reduce=False), q.block(reduce=True)), (256, 64))
        self.assertEqual((q.bits(reduce=False), q.bits(reduce=True)), (8, 4))
        with self.assertRaisesRegex(ValueError, "grad_block_size 48 must be"):
            dataclasses.replace(p, grad_block_size=48)  # replace checks again

    def test_bits_and_blocks_at_the_librarys_bounds(self) -> None:
        lo, hi = enums.MIN_BLOCK_SIZE, enums.MAX_BLOCK_SIZE
        for name in ("block_size", "grad_block_size"):
            for block in (lo, hi):
                self.assertEqual(getattr(Policy(**{name: block}), name), block)
            for block in (lo // 2, lo - 1, lo + 1, hi - 1, hi + 1, 2 * hi, 256.0, True):
                self.refused(f"{name} {block!r} must be {enums.BLOCK_SIZE_RULE}", **{name: block})
        self.refused(f"block_size None must be {enums.BLOCK_SIZE_RULE}", block_size=None)
        for name in ("weight_bits", "grad_bits"):
            for bits in enums.QUANT_BITS:
                self.assertEqual(getattr(Policy(**{name: bits}), name), bits)
            for bits in (enums.BITS_INT4 - 1, enums.BITS_INT4 + 1, enums.BITS_INT8 - 1, enums.BITS_INT8 + 1, 8.0):
                self.refused(f"{name} {bits!r} must be {enums.BITS_RULE}", **{name: bits})

    def test_each_refusal_names_its_argument(self) -> None:
        self.refused("both None and hpz is False, so zpccl would serve nothing", weight_bits=None, grad_bits=None,
                     hpz=False)
        self.assertTrue(Policy(weight_bits=None, grad_bits=None).hpz)  # hpZ alone
        for name in ("hpz", "param_blocks", "error_feedback"):
            self.refused(f"{name} 1 must be True or False", **{name: 1})
        self.refused("grad_rounding 'up' must be one of 'nearest', 'stochastic'", grad_rounding="up")
        self.refused(f"seed -1 must be an int in [0, {enums.INT_MAX}]", seed=-1)
        self.refused(f"seed {enums.INT_MAX + 1} must be", seed=enums.INT_MAX + 1)
        self.assertEqual(Policy(seed=enums.INT_MAX).seed, enums.INT_MAX)
        self.refused("grad_block_size applies to qgZ's gradients", grad_bits=None, grad_block_size=64)
        self.refused("error_feedback and grad_rounding apply to qgZ's gradients", grad_bits=None, error_feedback=True,
                     grad_rounding="stochastic")
        self.refused("ranks_per_node 0 must be an int of at least 1", ranks_per_node=0)
        self.refused("node_id -1 must be an int of at least 0", node_id=-1)
        self.refused("ranks_per_node and node_id are exclusive", ranks_per_node=2, node_id=0)
        self.refused("hpz_size 1 must be an int of at least 2", hpz_size=1)
        self.refused("which hpz=False leaves on the framework's all-gathers: drop hpz_size, or set hpz=True",
                     hpz_size=2, hpz=False)
        self.refused("which weight_bits=None leaves on the framework's all-gathers: drop hpz_size, or give "
                     "weight_bits (4 or 8)", hpz_size=2, weight_bits=None)
        self.refused("hpz_size 4 must divide ranks_per_node 6", hpz_size=4, ranks_per_node=6)
        self.assertEqual(Policy(hpz_size=2, ranks_per_node=6).hpz_size, 2)

    def test_comm_config_in_each_collectives_blocks(self) -> None:
        p = Policy(grad_bits=None, block_size=64, ranks_per_node=2, seed=3)
        self.assertEqual(p.comm_config(reduce=False), dict(weight_bits=8, grad_bits=enums.BITS_INT4, block_size=64,
                                                           ranks_per_node=2, grad_rounding="nearest", grad_seed=3))
        p = Policy(weight_bits=4, grad_block_size=32)
        self.assertEqual(p.comm_config(reduce=True)["block_size"], 32)
        self.assertEqual(p.comm_config(reduce=False)["block_size"], 256)
        self.assertNotIn("node_id", p.comm_config(reduce=True))


class ResolvePolicy(unittest.TestCase):
    CALL = "zpccl.fsdp.enable"

    def test_a_policy_or_its_fields(self) -> None:
        p = Policy(weight_bits=4)
        self.assertIs(resolve_policy(self.CALL, p, {}), p)
        self.assertEqual(resolve_policy(self.CALL, None, dict(weight_bits=4)), p)
        self.assertEqual(resolve_policy(self.CALL, None, {}), Policy())

    def test_refusals_name_the_call_and_the_arguments(self) -> None:
        with self.assertRaisesRegex(ValueError, r"^zpccl\.fsdp\.enable: give policy or keyword arguments, not both: "
                                                r"policy= and block_size=, grad_bits="):
            resolve_policy(self.CALL, Policy(), dict(grad_bits=8, block_size=64))
        with self.assertRaisesRegex(ValueError, r"^zpccl\.fsdp\.enable: block_size 100 must be a power of two"):
            resolve_policy(self.CALL, None, dict(block_size=100))
        with self.assertRaisesRegex(TypeError, r"^zpccl\.fsdp\.enable: unknown argument\(s\) blocksize; .* block_size"):
            resolve_policy(self.CALL, None, dict(blocksize=64))
        with self.assertRaisesRegex(TypeError, "policy must be a zpccl.ZeroPlusPlusPolicy, got dict"):
            resolve_policy(self.CALL, dict(weight_bits=8), {})


class SessionBase(unittest.TestCase):
    def test_the_policy_read_through_the_session(self) -> None:
        class Zp(Session):
            disabled = 0

            def __init__(self, policy: zpccl.ZeroPlusPlusPolicy) -> None:
                self.policy, self.report = policy, Report(logging.getLogger("zpccl.test"))

            def disable(self) -> None:
                self.disabled += 1

        policy = Policy(weight_bits=4, grad_bits=8, block_size=64, grad_block_size=32, hpz_size=2)
        with Zp(policy) as zp:
            self.assertEqual((zp.weight_bits, zp.grad_bits, zp.block_size, zp.grad_block_size, zp.hpz_size),
                             (4, 8, 64, 32, 2))
            self.assertEqual((zp.hpz, zp.param_blocks, zp.error_feedback), (True, True, False))
            self.assertEqual(Zp(Policy(block_size=128)).grad_block_size, 128)  # the gradients' blocks default
            with self.assertRaises(AttributeError):
                zp.weight_bits = 8  # type: ignore[misc]
            zp.report.count("qwz", 10, 4)
            self.assertEqual(zp.summary(), {"qwz": dict(calls=1, logical_bytes=10, wire_bytes=4)})
            zp.reset_stats()
            self.assertEqual(zp.summary(), {})
        self.assertEqual(zp.disabled, 1)

    def test_hpz_group_rule(self) -> None:
        def members(*placed: tuple[int, int]) -> list[dict[str, int]]:  # (node, local rank), nodes of 4 ranks
            return [dict(node=n, local=r, local_size=4) for n, r in placed]

        self.assertIsNone(hpz_group_problem(members((1, 2), (1, 3)), 2))
        self.assertEqual(hpz_group_problem(members((0, 3), (1, 0)), 2), "on nodes [0, 1]")
        self.assertIn("not 2 consecutive ones from a multiple of 2", hpz_group_problem(members((0, 1), (0, 2)), 2))
        self.assertIn("not 2 consecutive", hpz_group_problem(members((0, 1), (0, 0)), 2))
        self.assertIn("a node of 4 ranks, which groups of 3 do not divide",
                      hpz_group_problem(members((0, 0), (0, 1), (0, 2)), 3))
        error = refuse_hpz_group("zpccl.x.enable", "hpz_size", 2, "X gather over ranks [1, 2]", "on nodes [0, 1]",
                                 "X's", " (modules ['a'])")
        self.assertIsInstance(error, ValueError)
        self.assertRegex(error.message, r"^zpccl\.x\.enable: hpz_size=2 makes X gather over ranks \[1, 2\], which are "
                         r"on nodes \[0, 1\]: .* \(modules \['a'\]\)\. Use a hpz_size that divides .* on X's$")



class ScriptOptions(unittest.TestCase):
    """The examples' and perf scripts' --weight-bits, --grad-bits, --block-size and --grad-block-size come from
    fsdp2_train.add_quant_args, whose defaults are the policy's fields': a script run without them quantizes as
    zpccl.fsdp.enable(model) would."""

    #: Each script, and the policy fields whose defaults it takes (grad_numerics' --weight-bits is its own: 0, FSDP's
    #: exact gathers, so that its runs differ only in their gradients).
    SCRIPTS = {
        "tools/python/examples/fsdp2_train.py": ("weight_bits", "grad_bits", "block_size", "grad_block_size"),
        "tools/python/examples/deepspeed_train.py": ("weight_bits", "grad_bits", "block_size", "grad_block_size"),
        "tools/python/examples/zero3_train.py": ("weight_bits", "grad_bits", "block_size"),
        "perf/fsdp_step.py": ("weight_bits", "grad_bits", "block_size", "grad_block_size"),
        "perf/fsdp_memory.py": ("weight_bits", "grad_bits", "block_size"),
        "perf/ddp_step.py": ("grad_bits", "block_size", "grad_block_size"),
        "perf/experiments/grad_numerics.py": ("block_size",),
    }

    def test_scripts_default_to_the_policys_fields(self) -> None:
        policy = {f.name: f.default for f in dataclasses.fields(Policy)}
        for script, fields in self.SCRIPTS.items():
            with self.subTest(script=script):
                args = vars(load_script(script).parse_args([]))
                self.assertEqual({name: args.get(name, "missing") for name in fields},
                                 {name: policy[name] for name in fields})
        self.assertEqual(vars(load_script("perf/experiments/grad_numerics.py").parse_args([]))["weight_bits"], 0)

    def test_options_parse_and_unknown_fields_are_refused(self) -> None:
        ex = load_script("tools/python/examples/fsdp2_train.py")
        p = argparse.ArgumentParser()
        ex.add_quant_args(p, ("grad_bits", "block_size"), helps={"grad_bits": "the script's own words"})
        self.assertEqual(vars(p.parse_args(["--grad-bits", "8", "--block-size", "64"])),
                         dict(grad_bits=8, block_size=64))
        self.assertIn("the script's own words", p.format_help())
        with contextlib.redirect_stderr(io.StringIO()), self.assertRaises(SystemExit):
            p.parse_args(["--weight-bits", "8"])  # not asked for
        for fields, helps in ((("block_size", "seed"), None), (("block_size",), {"grad_bits": "x"})):
            with self.subTest(fields=fields, helps=helps), self.assertRaisesRegex(ValueError, "add_quant_args: "):
                ex.add_quant_args(argparse.ArgumentParser(), fields, helps)


if __name__ == "__main__":
    unittest.main()
