"""Tensor-parallel processes: rank 0 is the caller's process (it owns the `LLMEngine`: scheduler,
speculator, drafter, sampling); ranks 1 .. tp-1 are spawned workers that run the same forward
over their shard of the target (`tensor_parallel.py`).

Per step rank 0 sends the step's `StepMetadata` (on CPU, pickled) and the tap layers to every
worker through its pipe, then all ranks run the forward; the two all-reduces per layer go over a
torch.distributed process group ("gloo" on CPU, "nccl" on CUDA, rendezvous on a free localhost
port, COLLECTIVE_TIMEOUT_S on every collective). The control channel is a pipe and not a
broadcast so that an idle worker can wait for the next step without a collective timing out,
and so that it sees its parent go away (end of file) and exits.

Lifecycle: `TPGroup.start` spawns the workers (torch.multiprocessing, "spawn"), waits for each
to report in, joins the process group; `wait_ready` collects each worker's cache geometry or
its error; `shutdown` (also run when the group is garbage collected, and at interpreter exit)
sends "stop", joins, terminates a worker that does not exit, and destroys the process group.
Any failure (a worker's exception arrives with its traceback) shuts the whole group down.
"""

from __future__ import annotations

import os
import pickle
import socket
import time
import traceback
import weakref
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from .engine import EngineArgs, LLMEngine
from .engine_loader import Manifest
from .plugin_loader import check_gpu_formats
from .tensor_parallel import (
    build_rank,
    check_tensor_parallel_size,
    meta_to,
    rank_device,
    resolve_model_impl,
)

# A step's all-reduces take milliseconds; a peer silent this long is stuck or gone.
COLLECTIVE_TIMEOUT_S = 120.0
# Spawning imports torch and loads a shard; on a busy 2-core machine that took ~5 s.
STARTUP_TIMEOUT_S = 180.0
# A worker asked to stop exits at once; after this it is terminated.
STOP_TIMEOUT_S = 10.0


class TPError(RuntimeError):
    """A tensor-parallel rank failed (the message names the rank and carries its traceback);
    the group is shut down and the engine cannot step any more."""


def _worker_failure(rank: int, tb: str) -> str:
    """"tensor-parallel rank R failed: <its exception line>" and then its whole traceback."""
    last = tb.strip().splitlines()[-1] if tb.strip() else "no traceback"
    return f"tensor-parallel rank {rank} failed: {last}\n{tb}"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for the rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _backend(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def _send(conn, obj) -> None:
    """Plain pickle (not torch's shared-memory reductions: step metadata is small)."""
    conn.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def _recv(conn):
    return pickle.loads(conn.recv_bytes())


# ---- the worker side ---------------------------------------------------------------------
def worker_main(rank: int, tp: int, port: int, engine_dir: str, args: EngineArgs,
                device: str, threads: int, conn) -> None:
    """Entry point of spawned rank `rank`: report in, join the group, load the shard, serve
    steps until "stop" or the parent's end of the pipe closes. Errors go back as
    ("error", rank, traceback) before the process exits."""
    torch.set_num_threads(threads)
    try:
        _send(conn, ("hello", rank, os.getpid()))
        dev = rank_device(torch.device(device), rank)
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        dist.init_process_group(_backend(dev), init_method=f"tcp://127.0.0.1:{port}",
                                rank=rank, world_size=tp,
                                timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
        runner, geometry = _build_runner(Path(engine_dir), args, rank, dev)
        _send(conn, ("ready", rank, geometry))
        _serve(conn, runner, dev)
    except BaseException:                        # noqa: BLE001 - reported, then the process ends
        try:
            _send(conn, ("error", rank, traceback.format_exc()))
        except (OSError, ValueError):
            pass                                 # the parent is gone already
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _build_runner(engine_dir: Path, args: EngineArgs, rank: int, dev: torch.device):
    """The rank's shard model over its own KV cache (same geometry as rank 0's): a
    `ModelRunner` or a `PluginRunner` (same model_impl, buckets and graph use as rank 0).
    Returns (runner, cache geometry)."""
    impl = resolve_model_impl(args.model_impl, dev)
    runner, cache, _, _ = build_rank(engine_dir, Manifest.read(engine_dir), args, rank, dev,
                                     impl)
    return runner, cache.geometry


def _serve(conn, runner, dev: torch.device) -> None:
    """Run every ("forward", meta, tap_layers) and ("capture_all", tap_layers) that rank 0
    sends, until ("stop",) or EOF."""
    while True:
        try:
            msg = _recv(conn)
        except (EOFError, OSError):
            return                               # the parent process is gone
        if msg[0] == "stop":
            return
        if msg[0] == "forward":
            runner.forward(meta_to(msg[1], dev), msg[2])
        elif msg[0] == "capture_all":
            runner.capture_all(msg[1])
        else:
            raise ValueError(f"unknown tensor-parallel command {msg[0]!r}")


# ---- the rank-0 side ----------------------------------------------------------------------
def _stop(procs: list, conns: list, owns_group: list[bool]) -> None:
    """Stop the workers (ask, wait STOP_TIMEOUT_S, terminate) and destroy the process group.
    A plain function of the handles, so that `weakref.finalize` can run it."""
    for conn in conns:
        try:
            _send(conn, ("stop",))
        except (OSError, ValueError):
            pass
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.terminate()
            proc.join(STOP_TIMEOUT_S)
    for conn in conns:
        conn.close()
    if owns_group[0] and dist.is_initialized():
        dist.destroy_process_group()
    owns_group[0] = False


class TPGroup:
    """Rank 0's handle on the workers and the process group (module docstring)."""

    def __init__(self, procs: list, conns: list, device: torch.device):
        self.procs, self.conns, self.device = procs, conns, device
        self.tp_size = len(procs) + 1
        self._owns_group = [False]
        self.failed: str | None = None
        self._finalizer = weakref.finalize(self, _stop, procs, conns, self._owns_group)

    @classmethod
    def start(cls, engine_dir: Path, args: EngineArgs, device: torch.device,
              tp: int) -> TPGroup:
        """Spawn ranks 1 .. tp-1 and join the process group as rank 0.

        Raises:
            RuntimeError: a process group already exists in this process (one tensor-parallel
                engine at a time: shut the other down first); TPError: a worker died or
                failed before joining.
        """
        if dist.is_initialized():
            raise RuntimeError("tensor_parallel_size: a torch.distributed process group "
                               "already exists in this process (one tensor-parallel LLM at a "
                               "time; shut the other down first)")
        ctx = torch.multiprocessing.get_context("spawn")
        port, procs, conns = free_port(), [], []
        for rank in range(1, tp):
            parent, child = ctx.Pipe(duplex=True)
            proc = ctx.Process(target=worker_main, daemon=True, name=f"kolibri-tp{rank}",
                               args=(rank, tp, port, str(engine_dir), args, str(device),
                                     torch.get_num_threads(), child))
            proc.start()
            child.close()
            procs.append(proc)
            conns.append(parent)
        group = cls(procs, conns, device)
        try:
            group._expect("hello")
            if device.type == "cuda":
                torch.cuda.set_device(rank_device(device, 0))
            dist.init_process_group(_backend(device), init_method=f"tcp://127.0.0.1:{port}",
                                    rank=0, world_size=tp,
                                    timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
            group._owns_group[0] = True
        except BaseException:
            group.shutdown()
            raise
        return group

    def _expect(self, kind: str) -> list:
        """The ("kind", rank, payload) message of every worker, in rank order; raises TPError
        with a worker's traceback, or when one dies or stays silent past STARTUP_TIMEOUT_S."""
        out, deadline = [], time.monotonic() + STARTUP_TIMEOUT_S
        for rank, (proc, conn) in enumerate(zip(self.procs, self.conns), start=1):
            while not conn.poll(0.05):          # a dead worker's pipe polls as readable
                if time.monotonic() > deadline:
                    raise TPError(f"tensor-parallel rank {rank}: no {kind!r} within "
                                  f"{STARTUP_TIMEOUT_S:.0f} s")
            try:
                msg = _recv(conn)
            except (EOFError, OSError):
                proc.join(STOP_TIMEOUT_S)
                raise TPError(f"tensor-parallel rank {rank} exited with code "
                              f"{proc.exitcode} before sending {kind!r}") from None
            if msg[0] == "error":
                raise TPError(_worker_failure(msg[1], msg[2]))
            if msg[0] != kind:
                raise TPError(f"tensor-parallel rank {rank}: expected {kind!r}, got {msg[0]!r}")
            out.append(msg[2])
        return out

    def wait_ready(self, geometry) -> None:
        """Wait until every worker has loaded its shard; raises TPError (a worker's error, or
        a cache geometry that differs from rank 0's)."""
        for rank, theirs in enumerate(self._expect("ready"), start=1):
            if theirs != geometry:
                raise TPError(f"tensor-parallel rank {rank}: cache geometry {theirs} differs "
                              f"from rank 0's {geometry}")

    def send_step(self, meta, tap_layers: tuple[int, ...]) -> None:
        """Hand one forward pass to every worker (metadata moved to CPU for the pipe)."""
        self.send(("forward", meta_to(meta, "cpu"), tuple(tap_layers)))

    def send(self, msg: tuple) -> None:
        """Send one command to every worker."""
        for conn in self.conns:
            _send(conn, msg)

    def fail(self, exc: BaseException) -> TPError:
        """Shut the group down after a failed step; returns the error to raise (a worker's
        reported traceback when there is one)."""
        reason = f"{type(exc).__name__}: {exc}"
        for rank, conn in enumerate(self.conns, start=1):
            try:
                if conn.poll(1.0):
                    msg = _recv(conn)
                    if msg[0] == "error":
                        reason = _worker_failure(rank, msg[2])
                        break
            except (EOFError, OSError):
                continue
        self.failed = reason
        self.shutdown()
        return TPError(f"tensor-parallel step failed; {reason}")

    def shutdown(self) -> None:
        """Stop the workers and destroy the process group (idempotent)."""
        self._finalizer()

    @property
    def alive(self) -> bool:
        return self._finalizer.alive


class TPDriverRunner:
    """Rank 0's runner: sends each step to the workers, then runs its own shard's forward
    (the full logits and taps come out of rank 0). Other attributes are the inner runner's."""

    def __init__(self, runner, group: TPGroup):
        self.runner, self.group = runner, group

    def forward(self, meta, tap_layers: tuple[int, ...] = ()):
        """As `ModelRunner.forward`; raises TPError when a rank fails (the group stops)."""
        return self._together(lambda: self.group.send_step(meta, tap_layers),
                              lambda: self.runner.forward(meta, tap_layers))

    def capture_all(self, tap_layers: tuple[int, ...] = ()) -> int:
        """`PluginRunner.capture_all` on every rank at once (the same buckets in the same
        order, so the warm-up all-reduces pair up); raises TPError as `forward`."""
        return self._together(lambda: self.group.send(("capture_all", tuple(tap_layers))),
                              lambda: self.runner.capture_all(tap_layers))

    def _together(self, send, run):
        """send() the command to the workers, then run() rank 0's part."""
        if self.group.failed is not None:
            raise TPError(f"the tensor-parallel group stopped earlier; {self.group.failed}")
        try:
            send()
            return run()
        except BaseException as exc:
            error = self.group.fail(exc)
            if not isinstance(exc, Exception):
                raise                            # KeyboardInterrupt, SystemExit: as they are
            raise error from exc

    def __getattr__(self, name: str):
        return getattr(self.runner, name)


class TPLLMEngine(LLMEngine):
    """`LLMEngine` over a tensor-parallel engine: rank 0 here, ranks 1 .. tp-1 spawned.

    The hook is `LLMEngine._load_target`, overridden to load rank 0's shard, plan the cache
    from the shard config (kv_cache_memory is per rank) and wrap the runner. `config` is the
    whole model's. model_impl as at TP1: "reference" (the reference modules), "plugins" (the
    kernel path, `PluginRunner` on every rank; on CUDA, unless enforce_eager, every bucket's
    CUDA graph, NCCL all-reduces included, is captured at start-up on all ranks together),
    "auto" (plugins on CUDA, reference on CPU). Call
    `shutdown()` when done (garbage collection does it too).

    Raises:
        ValueError: naming tensor_parallel_size (not the engine's tp_size, not enough CUDA
            devices) or the weight group the kernel path cannot run (model_impl "plugins");
            lm_head_kernel or attention_linear_kernel other than "mma" (or "auto": mma);
        TPError: a worker failed to start or load (its traceback in the message).
    """

    def __init__(self, engine_dir: str | Path, speculative: str = "copy+drafter",
                 args: EngineArgs | None = None, device: str = "cpu",
                 tensor_parallel_size: int = 2):
        args = args or EngineArgs()
        dev = torch.device(device)
        manifest = Manifest.read(engine_dir)
        check_tensor_parallel_size(manifest, tensor_parallel_size)
        for name in ("lm_head_kernel", "attention_linear_kernel"):
            if getattr(args, name) not in ("mma", "auto"):   # "auto" is "mma" at TP ranks
                raise ValueError(f"{name}: {getattr(args, name)!r} runs at "
                                 f"tensor_parallel_size 1 only")
        if resolve_model_impl(args.model_impl, dev) == "plugins":
            check_gpu_formats(manifest)          # before any worker is spawned
        if dev.type == "cuda" and torch.cuda.device_count() < (dev.index or 0) + \
                tensor_parallel_size:
            raise ValueError(f"tensor_parallel_size={tensor_parallel_size}: needs that many "
                             f"CUDA devices from {dev}, torch sees {torch.cuda.device_count()}")
        self.tp_group = TPGroup.start(Path(engine_dir), args, dev, tensor_parallel_size)
        try:
            super().__init__(engine_dir, speculative, args, device)
            self.tp_group.wait_ready(self.cache.geometry)
            if getattr(self.runner.runner, "use_graphs", False):
                self.runner.capture_all(self.tap_layers)   # all ranks, as LLMEngine at TP1
        except BaseException:
            self.tp_group.shutdown()
            raise

    def _load_target(self, engine_dir: Path):
        """Rank 0's shard, its cache (only its KV heads) and the driving runner; returns what
        the drafter borrows (the shard's embedding is whole, and so is its head)."""
        impl = resolve_model_impl(self.args.model_impl, self.device)
        runner, self.cache, target, full = build_rank(engine_dir, self.manifest, self.args, 0,
                                                      self.device, impl)
        self.config, self.model_impl = full, impl
        self.runner = TPDriverRunner(runner, self.tp_group)
        return target

    def shutdown(self) -> None:
        """Stop the worker processes and the process group (idempotent)."""
        self.tp_group.shutdown()
