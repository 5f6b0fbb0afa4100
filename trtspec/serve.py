"""What `trtspec serve` puts beside tritonserver: the folder it serves, the admin-API key and the OpenAI
frontend."""

from __future__ import annotations

import gc
import ipaddress
import secrets
import socket
import time
from pathlib import Path

from trtspec.errors import ConfigError
from trtspec.triton.server import ServeError, TritonServer


def model_repository(build_dir: Path) -> Path:
    """The Triton model repository `trtspec serve DIR` serves: DIR/model_repository (a torch or
    engine build) or DIR itself (a repository given directly). Refuses, with the fix, a path that is
    missing, a TensorRT-LLM deployment (served by its own launch script on GPU nodes) and a folder
    that holds no model."""
    from trtspec.triton.repo import REPO_DIR, check_stub_paths
    from trtspec.trtllm.launch import SERVE_CONFIG

    if not build_dir.is_dir():
        raise ServeError(f"{build_dir} is not a folder: give the output folder of `trtspec build`"
                         + ("" if build_dir.exists() else " (run it first)"))
    if (build_dir / SERVE_CONFIG).is_file():
        raise ServeError(f"{build_dir} is a TensorRT-LLM deployment (flavour trtllm): serve it on its GPU "
                         f"nodes with {build_dir / 'deploy' / 'launch.sh'}; `trtspec serve` serves the "
                         "torch and engine flavours")
    repo = build_dir / REPO_DIR if (build_dir / REPO_DIR).is_dir() else build_dir
    if not any(repo.glob("*/config.pbtxt")):
        what = f"no {REPO_DIR}/, no */config.pbtxt" if repo == build_dir else f"no {REPO_DIR}/*/config.pbtxt"
        raise ServeError(f"{build_dir} holds no Triton model ({what}): give the output folder of "
                         "`trtspec build`")
    try:
        check_stub_paths({"DIR": build_dir})
    except ConfigError as exc:
        raise ServeError(str(exc)) from None
    for pbtxt in sorted(repo.glob("*/config.pbtxt")):
        # a Python-backend model without its model.py: tritonserver waits minutes for the stub
        versions = [d for d in pbtxt.parent.iterdir() if d.is_dir() and d.name.isdigit()]
        if 'backend: "python"' in pbtxt.read_text(encoding="utf-8", errors="replace") \
                and not any((d / "model.py").is_file() for d in versions):
            raise ServeError(f"{pbtxt.parent} has no <version>/model.py ({pbtxt.parent / '1' / 'model.py'} "
                             "is missing): the build is incomplete; build it again with `trtspec build`")
    return repo


def is_loopback(host: str) -> bool:
    """True when `host` (an address or a name) only reaches this machine."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    return bool(addresses) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses)


def admin_key_for(host: str, api_key: str | None) -> tuple[str | None, bool]:
    """The key Triton's admin APIs require, and whether it was generated: the API key when one is
    given; a fresh random one when the server is reachable from other machines; else none."""
    if api_key:
        return api_key, False
    if is_loopback(host):
        return None, False
    return secrets.token_urlsafe(24), True


def start_openai_frontend(server: TritonServer, port: int, api_key: str | None,
                          tool_parser: str | None = None, reasoning_parser: str | None = None,
                          allowed_origins: tuple[str, ...] = (), compact_json: bool = False,
                          served_names: tuple[str, ...] = ()):
    """(the OpenAI-compatible frontend for the repository's model on the server's host, None), or
    (None, why not) when the repository holds no single trtspec model. `tool_parser`: finds the
    tool calls of tool_choice "auto" (None: auto is refused); `reasoning_parser`: reads chat answers'
    reasoning off their content (None: all is content); `allowed_origins`: web pages whose scripts
    may call it (openai/cors.py); `compact_json`: structured outputs' JSON written compactly;
    `served_names`: the names the API answers to (none: the model's own)."""
    from trtspec.openai.model_info import served_model_of_repo
    from trtspec.openai.server import OpenAIFrontend

    try:
        model = served_model_of_repo(server.repo, tool_parser, reasoning_parser, compact_json, served_names)
    except ConfigError as exc:
        return None, f"no OpenAI frontend: {exc}"
    frontend = OpenAIFrontend(model, server.local_grpc_address, server.host, port, api_key, allowed_origins)
    return frontend.start(), None


def wait_for_exit(server: TritonServer, poll_s: float = 0.5) -> int:
    """Wait for the server to exit; its exit code. A signal handler's KeyboardInterrupt (Ctrl-C,
    SIGTERM) ends the wait at once: raised inside `Popen.wait` it would first wait 0.25 s more for
    the child to die of the same Ctrl-C (CPython's bpo-25942), which a server in its own session
    never receives."""
    while server.running:
        time.sleep(poll_s)
    return server.wait()


def exit_quickly() -> None:
    """Spare the interpreter's last garbage collections, once every server is stopped: with torch
    and transformers loaded they took 0.8-1.2 s of every `trtspec serve`'s exit on a 2-core CPU
    (0.16 s frozen). Frozen objects are only left to the process's end; atexit handlers still run."""
    gc.freeze()
