"""zpccl.launch: spawned ranks get torch.distributed's env:// rendezvous and return their results in rank order;
the first rank that raises or dies is named, with its traceback, and the others are stopped; a return value that
cannot be pickled is named as the failure; run() stays in
this process under torchrun. The rendezvous itself is checked with torch's gloo backend where torch is
installed."""
from __future__ import annotations

import os
import time
import unittest
from typing import Any
from unittest import mock

import zpccl.launch as launch


def _rendezvous(tag: str) -> tuple[str, dict[str, str]]:
    return tag, {k: os.environ[k] for k in launch.RENDEZVOUS + ("ZPCCL_TEST_EXTRA",)}


def _fails_on(bad: int, how: str) -> int:
    rank = int(os.environ["RANK"])
    if rank == bad:
        if how == "raise":
            raise ValueError(f"rank {rank} refuses")
        os._exit(3)
    time.sleep(60)  # stands for a peer waiting for the failed rank in a collective
    return rank


def _keeps_running_on_sigterm(bad: int) -> int:
    """A rank that, as trainers that checkpoint on SIGTERM do, handles SIGTERM and goes on (or is inside a C call,
    where Python's handler waits for the call to return); rank `bad` (if any) raises."""
    import signal

    signal.signal(signal.SIGTERM, lambda *_: None)
    rank = int(os.environ["RANK"])
    if rank == bad:
        time.sleep(2)  # the other rank's handler is in place
        raise ValueError(f"rank {rank} refuses")
    time.sleep(90)
    return rank


def _returns_a_lock() -> Any:
    import threading

    return threading.Lock()


def _exit(code: Any) -> None:
    raise SystemExit(code)


def _gloo_sum() -> float:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        x = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(x)
        return float(x)
    finally:
        dist.destroy_process_group()


class Spawn(unittest.TestCase):
    def test_ranks_get_the_rendezvous_and_return_in_order(self) -> None:
        results = launch.spawn(_rendezvous, 3, "t", env={"ZPCCL_TEST_EXTRA": "x", "RANK": "ignored"})
        self.assertEqual([tag for tag, _ in results], ["t"] * 3)
        envs = [env for _, env in results]
        self.assertEqual([(e["RANK"], e["LOCAL_RANK"], e["WORLD_SIZE"]) for e in envs],
                         [(str(r), str(r), "3") for r in range(3)])
        self.assertEqual({(e["MASTER_ADDR"], e["MASTER_PORT"], e["ZPCCL_TEST_EXTRA"]) for e in envs},
                         {("127.0.0.1", envs[0]["MASTER_PORT"], "x")})
        self.assertGreater(int(envs[0]["MASTER_PORT"]), 0)

    def test_the_failed_rank_is_named_and_the_others_stopped(self) -> None:
        for how, words in (("raise", "ValueError: rank 1 refuses"), ("die", "exited with code 3")):
            with self.subTest(how=how):
                start = time.monotonic()
                with self.assertRaises(launch.RankFailed) as caught:
                    launch.spawn(_fails_on, 3, 1, how)
                self.assertEqual((caught.exception.rank, caught.exception.nprocs), (1, 3))
                self.assertIn(words, str(caught.exception))
                self.assertTrue(str(caught.exception).startswith("rank 1 of 3 failed"))
                self.assertLess(time.monotonic() - start, 45, "the sleeping ranks were not stopped")

    def test_a_result_that_cannot_be_pickled_is_named(self) -> None:
        with self.assertRaises(launch.RankFailed) as caught:
            launch.spawn(_returns_a_lock, 2, timeout=60)
        text = str(caught.exception)
        self.assertRegex(text, r"^rank \d of 2 failed:\n")
        self.assertIn("_returns_a_lock's return value (a _thread.lock) cannot be pickled", text)
        self.assertIn("cannot pickle '_thread.lock' object", text)

    def test_system_exit(self) -> None:
        self.assertEqual(launch.spawn(_exit, 2, 0), [None, None])
        with self.assertRaisesRegex(launch.RankFailed, r"rank 0 of 1 failed:\nSystemExit\(2\)"):
            launch.spawn(_exit, 1, 2)

    def test_timeout_and_bad_counts(self) -> None:
        with self.assertRaisesRegex(TimeoutError, r"ranks \[0, 1\] still running after 1 s"):
            launch.spawn(_fails_on, 2, -1, "raise", timeout=1)  # no rank fails: both sleep
        for bad in (0, -1, True, 2.0):
            with self.assertRaisesRegex(ValueError, "nprocs .* must be an int of at least 1"):
                launch.spawn(_rendezvous, bad, "t")

    def test_ranks_that_outlive_sigterm_are_killed(self) -> None:
        """The timeout and a failed rank stop the others even when they handle SIGTERM and go on: spawn returns
        within its grace period instead of waiting for them to finish on their own."""
        # The failed rank's case gets a timeout its ranks' start cannot reach on a loaded machine. Waiting for the
        # other rank to finish would take its 90 s sleep.
        for bad, error, timeout in ((-1, TimeoutError, 5), (1, launch.RankFailed, 60)):
            with self.subTest(bad=bad):
                start = time.monotonic()
                with self.assertRaises(error):
                    launch.spawn(_keeps_running_on_sigterm, 2, bad, timeout=timeout)
                self.assertLess(time.monotonic() - start, 60, "spawn waited for ranks that ignored SIGTERM")

    def test_run_stays_here_under_torchrun(self) -> None:
        with mock.patch.dict(os.environ, {"RANK": "5"}):
            self.assertEqual(launch.run(lambda x: (x, os.getpid()), 4, "here"), [("here", os.getpid())])

    def need_gloo(self) -> None:
        try:
            import torch.distributed as dist
        except ImportError:
            self.skipTest("torch is not installed")
        if not dist.is_available() or not dist.is_gloo_available():
            self.skipTest("this torch has no gloo backend")

    def test_the_rendezvous_serves_torch_distributed(self) -> None:
        self.need_gloo()
        self.assertEqual(launch.spawn(_gloo_sum, 2, timeout=120), [3.0, 3.0])

    def test_a_port_taken_before_rank_0_listens_is_replaced(self) -> None:
        self.need_gloo()
        import contextlib
        import io
        import socket

        with socket.socket() as squatter:
            squatter.bind(("127.0.0.1", 0))
            squatter.listen()
            taken = squatter.getsockname()[1]
            ports = [taken, taken, launch.free_port()]
            err = io.StringIO()
            with mock.patch.object(launch, "free_port", side_effect=ports), contextlib.redirect_stderr(err):
                self.assertEqual(launch.spawn(_gloo_sum, 2, timeout=120), [3.0, 3.0])
            self.assertEqual(err.getvalue().count(f"rendezvous port {taken} was taken"), 2)
            self.assertIn(f"try 3 of {launch.RENDEZVOUS_TRIES}", err.getvalue())
            # Every try on the taken port: the last failure is the caller's, named.
            with mock.patch.object(launch, "free_port", return_value=taken), contextlib.redirect_stderr(io.StringIO()):
                with self.assertRaises(launch.RankFailed) as failed:
                    launch.spawn(_gloo_sum, 2, timeout=120)
            self.assertEqual(failed.exception.rank, 0)
            self.assertIn("EADDRINUSE", failed.exception.details)

    def test_a_taken_port_is_read_in_either_wording(self) -> None:
        newer = ("DistNetworkError: The server socket has failed to listen on any local network address. port: 29500, "
                 "useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use")
        older = ("RuntimeError: The server socket has failed to listen on any local network address. The server "
                 "socket has failed to bind to [::]:29500 (errno: 98 - Address already in use).")
        for details in (newer, older):
            self.assertTrue(launch._port_was_taken(launch.RankFailed(0, 2, details), 29500))
            self.assertFalse(launch._port_was_taken(launch.RankFailed(0, 2, details), 29501))  # another port
            self.assertFalse(launch._port_was_taken(launch.RankFailed(1, 2, details), 29500))  # not the store's rank
        self.assertFalse(launch._port_was_taken(launch.RankFailed(0, 2, "ValueError: port 29500 refused"), 29500))

    def test_other_failures_are_not_tried_again(self) -> None:
        with mock.patch.object(launch, "free_port", wraps=launch.free_port) as chosen:
            with self.assertRaises(launch.RankFailed):
                launch.spawn(_fails_on, 2, 0, "raise", timeout=60)
        self.assertEqual(chosen.call_count, 1)


if __name__ == "__main__":
    unittest.main()
