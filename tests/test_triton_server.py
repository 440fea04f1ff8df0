"""Triton Inference Server: the model repository written by the build and by `kolibri-trt
triton-repo`, its request logic without a server, and a real `tritonserver` (the one inside the
`nvidia-pytriton` wheel) on loopback serving a small engine with speculative="copy": HTTP
generate / generate_stream, gRPC streams equal to `LLM.generate`, 8 concurrent streams, bad
requests, a clean stop that leaves nothing in /dev/shm."""

from __future__ import annotations

import glob
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from kolibri_trt import SamplingParams

from test_runtime import PROMPTS

from triton_support import (KV_BYTES, TIMEOUT, engine, generate_on_worker,  # noqa: F401
                            llm, model_config)


# ---- a real tritonserver ----------------------------------------------------------------------
def _http(method: str, url: str, **kwargs) -> requests.Response:
    """One HTTP request on its own connection: Triton keeps a chunked response's keep-alive
    connection open, and an open connection holds up its shutdown (--exit-timeout-secs)."""
    return requests.request(method, url, headers={"Connection": "close"},
                            timeout=kwargs.pop("timeout", TIMEOUT), **kwargs)


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class TritonServer:
    """The `tritonserver` of the installed nvidia-pytriton wheel on loopback ports, with a
    Python backend prepared in `work` (the stub for this Python; the venv's bin first on PATH,
    so the stub's Python imports this venv's kolibri_trt) and its own shared-memory prefix."""

    def __init__(self, repo: Path, work: Path):
        import pytriton

        pkg = Path(pytriton.__file__).parent / "tritonserver"
        libs = Path(pytriton.__file__).parents[1] / "nvidia_pytriton.libs"
        backend = work / "backends" / "python"
        backend.mkdir(parents=True)
        for f in ("libtriton_python.so", "triton_python_backend_utils.py"):
            shutil.copy2(pkg / "backends" / "python" / f, backend / f)
        stub = pkg / "python_backend_stubs" / f"{sys.version_info[0]}.{sys.version_info[1]}"
        shutil.copy2(stub / "triton_python_backend_stub", backend / "triton_python_backend_stub")
        self.http_port, self.grpc_port = _free_ports(2)
        self.shm_prefix = f"triton_python_backend_shm_region_kolibri_test_{os.getpid()}_"
        env = dict(os.environ)
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        lib_path = [str(libs)]
        if sysconfig.get_config_var("Py_ENABLE_SHARED"):  # the stub loads this Python's libpython
            lib_path.insert(0, sysconfig.get_config_var("LIBDIR"))
        env["LD_LIBRARY_PATH"] = os.pathsep.join(lib_path + [env.get("LD_LIBRARY_PATH", "")])
        self.cmd = [str(pkg / "bin" / "tritonserver"), f"--model-repository={repo}",
                    f"--backend-directory={work / 'backends'}",
                    f"--cache-directory={pkg / 'caches'}",
                    "--http-address=127.0.0.1", f"--http-port={self.http_port}",
                    "--grpc-address=127.0.0.1", f"--grpc-port={self.grpc_port}",
                    "--allow-metrics=false", "--disable-auto-complete-config",
                    "--exit-timeout-secs=10",
                    f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}"]
        self.log_path = work / "tritonserver.log"
        self.stopped, self.leftover_shm = False, []
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         cwd=work, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        self.http = f"http://127.0.0.1:{self.http_port}"
        self.grpc = f"127.0.0.1:{self.grpc_port}"

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def wait_ready(self, timeout: float = 120.0) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tritonserver exited with {self.proc.returncode}:\n"
                                   f"{self.log_tail()}")
            try:
                if _http("GET", f"{self.http}/v2/health/ready", timeout=2).status_code == 200:
                    return time.monotonic() - t0
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"tritonserver not ready after {timeout} s:\n{self.log_tail()}")

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, wait; SIGKILL its process group if it hangs; remove its shm regions."""
        if self.stopped:
            return self.proc.returncode
        self.stopped = True
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(10)
            else:  # the server is gone: a stub it started may not be
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        finally:
            self.leftover_shm = sorted(glob.glob(f"/dev/shm/{self.shm_prefix}*"))
            for path in self.leftover_shm:
                Path(path).unlink(missing_ok=True)
        return self.proc.returncode


@pytest.fixture(scope="module")
def server(engine, tmp_path_factory):
    from kolibri_trt.cli import main

    work = tmp_path_factory.mktemp("triton")
    assert main(["triton-repo", "--engine", str(engine), "--out", str(work / "repo"),
                 "--speculative", "copy", "--kv-cache-memory", str(KV_BYTES)]) == 0
    srv = TritonServer(work / "repo", work)
    try:
        srv.ready_s = srv.wait_ready()
        yield srv
    finally:
        srv.stop()


def _tensor(name: str, value) -> grpcclient.InferInput:
    arr = np.asarray(value)
    if arr.dtype.kind in "USO":
        arr = np.array([[v.encode() if isinstance(v, str) else bytes(v) for v in np.ravel(arr)]],
                       dtype=np.object_)
    else:
        arr = arr.reshape(1, -1)
    t = grpcclient.InferInput(name, list(arr.shape),
                              "BYTES" if arr.dtype == np.object_ else np_to_triton_dtype(arr.dtype))
    t.set_data_from_numpy(arr)
    return t


def _request(prompt, max_tokens, *, temperature=None, seed=None, stream=True, **extra):
    inputs = [_tensor("max_tokens", np.int32(max_tokens)), _tensor("stream", np.bool_(stream))]
    if prompt is not None:
        inputs.append(_tensor("text_input", [prompt]))
    if temperature is not None:
        inputs.append(_tensor("temperature", np.float32(temperature)))
    if seed is not None:
        inputs.append(_tensor("random_seed", np.uint64(seed)))
    return inputs + [_tensor(k, v) for k, v in extra.items()]


def _grpc_stream(server, inputs, barrier: threading.Barrier | None = None
                 ) -> tuple[list[dict], float | None, float]:
    """One request on its own gRPC stream: (responses as {output: value}, time of the first
    response, time of the final one). Raises InferenceServerException for an error response.
    With a barrier, the request is sent when all parties have opened their streams."""
    q: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc)
    out, first = [], None
    try:
        client.start_stream(callback=lambda result, error: q.put((result, error)),
                            stream_timeout=TIMEOUT)
        if barrier is not None:
            barrier.wait(TIMEOUT)
        client.async_stream_infer("kolibri", inputs)
        while True:
            result, error = q.get(timeout=TIMEOUT)
            now = time.monotonic()
            if error is not None:
                raise error
            first = first if first is not None else now
            resp = result.get_response()
            out.append({o.name: result.as_numpy(o.name).reshape(-1)[0] for o in resp.outputs})
            if resp.parameters["triton_final_response"].bool_param:
                return out, first, now
    finally:
        client.stop_stream()
        client.close()


def _joined(responses: list[dict]) -> str:
    return b"".join(r["text_output"] for r in responses).decode()


def test_server_http_generate_and_generate_stream(server, llm):
    offline = generate_on_worker(llm, PROMPTS[0], SamplingParams(max_tokens=10))[0]
    r = _http("POST", f"{server.http}/v2/models/kolibri/generate",
              json={"text_input": PROMPTS[0], "max_tokens": 10})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["text_output"] == offline.text
    assert body["finish_reason"] == offline.finish_reason
    assert body["total_draft_tokens"] == sum(offline.metrics.spec.proposed.values())
    assert body["acceptance_length"] == pytest.approx(offline.metrics.spec.acceptance_length)

    offline = generate_on_worker(llm, PROMPTS[7], SamplingParams(max_tokens=16, temperature=0.7, seed=9))[0]
    with _http("POST", f"{server.http}/v2/models/kolibri/generate_stream",
               json={"text_input": PROMPTS[7], "max_tokens": 16, "temperature": 0.7,
                     "random_seed": 9, "stream": True, "bad_words": "", "stop_words": ""},
               stream=True) as r:
        assert r.status_code == 200
        events = [json.loads(line[len(b"data: "):]) for line in r.iter_lines()
                  if line.startswith(b"data: ")]
    assert len(events) > 1 and "".join(e["text_output"] for e in events) == offline.text
    assert [e["finish_reason"] for e in events][-1] == offline.finish_reason
    assert all(e["finish_reason"] == "" for e in events[:-1])


def test_server_grpc_stream_equals_llm_generate(server, llm):
    params = SamplingParams(max_tokens=24, temperature=0.8, seed=1234)
    offline = generate_on_worker(llm, PROMPTS[1], params)[0]
    responses, _, _ = _grpc_stream(server, _request(PROMPTS[1], 24, temperature=0.8, seed=1234))
    assert len(responses) > 1
    assert _joined(responses) == offline.text
    assert responses[-1]["finish_reason"].decode() == offline.finish_reason
    accepted = sum(offline.metrics.spec.accepted.values())
    assert responses[-1]["total_accepted_draft_tokens"] == accepted
    # stream=false on a gRPC stream: one final response with the whole text
    responses, _, _ = _grpc_stream(server, _request(PROMPTS[1], 24, temperature=0.8, seed=1234,
                                                    stream=False))
    assert len(responses) == 1 and responses[0]["text_output"].decode() == offline.text


def test_server_eight_concurrent_streams(server, llm):
    n, max_tokens = 8, 32
    params = [SamplingParams(max_tokens=max_tokens, temperature=0.9, seed=500 + i)
              for i in range(n)]
    offline = generate_on_worker(llm, PROMPTS, params)
    results: dict[int, tuple] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(n)

    def worker(i: int) -> None:
        try:
            inputs = _request(PROMPTS[i], max_tokens, temperature=0.9, seed=500 + i)
            results[i] = _grpc_stream(server, inputs, start)
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(3 * TIMEOUT)
    assert not errors and len(results) == n
    for i in range(n):
        responses = results[i][0]
        assert _joined(responses) == offline[i].text, i
        assert responses[-1]["finish_reason"].decode() == offline[i].finish_reason
    # one continuous batch, not one request after another: every stream had its first
    # response before the longest one finished, and most before the first one finished
    firsts = sorted(r[1] for r in results.values())
    finals = sorted(r[2] for r in results.values())
    print(f"8 streams: first responses within {firsts[-1] - firsts[0]:.2f} s, finals from "
          f"{finals[0] - firsts[0]:.2f} s to {finals[-1] - firsts[0]:.2f} s")
    assert firsts[-1] < finals[-1]
    assert sum(f < finals[0] for f in firsts) >= n // 2, (firsts, finals)


def test_server_bad_requests_get_errors_and_it_stays_up(server, llm):
    cases = [
        (_request(None, 4), "text_input: required"),
        (_request("x", -2), "max_tokens: must be >= 1, got -2"),
        (_request(b"caf\xe9", 4), "text_input: not valid UTF-8"),
        (_request("x", 4, speculative=["turbo"]), "speculative: unknown mode 'turbo'"),
    ]
    for inputs, message in cases:
        with pytest.raises(InferenceServerException, match=message):
            _grpc_stream(server, inputs)
    r = _http("POST", f"{server.http}/v2/models/kolibri/generate",
              json={"text_input": "x", "max_tokens": -1})
    assert r.status_code == 400 and "max_tokens: must be >= 1" in r.json()["error"]
    r = _http("POST", f"{server.http}/v2/models/kolibri/generate",
              json={"max_tokens": 3, "speculative": "turbo"})
    assert r.status_code == 400 and "text_input: required" in r.json()["error"]
    assert _http("GET", f"{server.http}/v2/health/ready").status_code == 200
    offline = generate_on_worker(llm, PROMPTS[6], SamplingParams(max_tokens=6))[0]
    responses, _, _ = _grpc_stream(server, _request(PROMPTS[6], 6))
    assert _joined(responses) == offline.text


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def test_server_cancelled_stream_is_aborted(server):
    """A client that cancels its stream frees the engine: the model's process goes idle."""
    stubs = [int(p.parent.name) for p in Path("/proc").glob("[0-9]*/stat")
             if p.read_text().rsplit(")", 1)[1].split()[1] == str(server.proc.pid)]
    assert len(stubs) == 1, stubs  # the Python-backend stub of the one model instance
    q: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc)
    try:
        client.start_stream(callback=lambda result, error: q.put((result, error)),
                            stream_timeout=TIMEOUT)
        client.async_stream_infer("kolibri", _request("Hi", 3000, end_id=np.int32(1999)))
        for _ in range(3):
            assert q.get(timeout=TIMEOUT)[1] is None
        busy = _cpu_ticks(stubs[0])
        time.sleep(1.0)
        busy = _cpu_ticks(stubs[0]) - busy
        client.stop_stream(cancel_requests=True)
    finally:
        client.close()
    time.sleep(0.5)
    idle = _cpu_ticks(stubs[0])
    time.sleep(1.0)
    idle = _cpu_ticks(stubs[0]) - idle
    assert busy >= 30 and idle <= 10, (busy, idle)  # ticks of 10 ms in 1 s


def test_server_stops_cleanly_and_leaves_nothing_in_dev_shm(server):
    """Last in this file: stops the module's server."""
    assert glob.glob(f"/dev/shm/{server.shm_prefix}*"), "the Python backend uses shared memory"
    t0 = time.monotonic()
    rc = server.stop()
    assert rc == 0, server.log_tail()
    assert time.monotonic() - t0 < 20
    assert server.leftover_shm == [] and not glob.glob(f"/dev/shm/{server.shm_prefix}*")
    print(f"tritonserver ready in {server.ready_s:.1f} s, stopped in "
          f"{time.monotonic() - t0:.1f} s")
