"""`coldstart engine ...`: run a checkpointable vLLM server and drive its dev-mode API by hand."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import List, Optional

import typer

URL = typer.Option("http://127.0.0.1:8000", "--url", help="the server's base URL")
TOKEN = typer.Option(None, "--token", envvar="COLDSTART_CONTROL_TOKEN",
                     help="the server's control token: `engine serve` writes it to RUN_DIR/control-token; a "
                          "snapshot's manifest.json has it (control_token); without it the dev-mode routes "
                          "answer 403")


def _client(url: str, token: str | None):
    from coldstart.engine.client import EngineClient

    return EngineClient(url, token=token)


def _print_answers(res) -> None:
    """Print the workers' answers; the first one that names an error becomes the command's."""
    print(json.dumps(res, indent=1))
    errs = [r["error"] for r in res if isinstance(r, dict) and r.get("error")]
    if errs:
        from coldstart.errors import ColdstartError

        raise ColdstartError(errs[0])


def serve_command(
    ctx: typer.Context,
    model: Path = typer.Argument(..., help="model directory (Hugging Face layout)"),
    port: int = typer.Option(8000, "--port", help="the server's port on 127.0.0.1"),
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="caches, sockets, temp files, server.log "
                                           "(default: ./coldstart-run-PORT)"),
    kv_cache_mb: int = typer.Option(256, "--kv-cache-mb", help="KV cache size (CPU: explicit, no profiling)"),
    sleep_mode: bool = typer.Option(True, "--sleep-mode/--no-sleep-mode", help="sleep mode (CPU: our worker)"),
    load_format: Optional[str] = typer.Option(None, "--load-format", help="e.g. coldstart (our flat file)"),
    device: str = typer.Option("cpu", "--device", help="cpu | cuda (cuda: unverified on GPU)"),
    new_pidns: bool = typer.Option(True, "--pidns/--no-pidns", help="own PID namespace (unshare --pid)"),
    timeout: float = typer.Option(900, "--timeout", help="seconds to wait for /health"),
) -> None:
    """Start the server (dev mode behind a control token, loopback, eager, no io_uring, own PID namespace)
    in the foreground.
    Extra vLLM arguments go after `--`. Ctrl-C (or SIGTERM) stops the whole tree."""
    from rich.console import Console

    from coldstart.engine.launcher import EngineSpec, start_engine

    console = Console(stderr=True)
    spec_kw = dict(model=model.resolve(), run_dir=(run_dir or Path(f"coldstart-run-{port}")).resolve(), port=port,
                   kv_cache_bytes=kv_cache_mb << 20 if device == "cpu" else 0, sleep_mode=sleep_mode,
                   load_format=load_format, extra_args=list(ctx.args))
    spec = (EngineSpec.for_gpu(**spec_kw) if device == "cuda" else EngineSpec(device=device, **spec_kw))
    eng = start_engine(spec, new_pidns=new_pidns)
    token_file = spec.run_dir / "control-token"  # for the other `engine` commands (--token)
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(spec.control_token or "")

    def _term(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _term)
    try:
        with console.status(f"starting vLLM on {spec.base_url} (log: {spec.log_path})"):
            secs = eng.wait_ready(timeout)
        console.print(f"[green]ready[/] {spec.base_url} in {secs:.1f} s; pids {eng.pids()}; control token in "
                      f"{token_file} (COLDSTART_CONTROL_TOKEN=$(cat {token_file}) for the other engine commands); "
                      "Ctrl-C stops")
        while eng.alive():
            time.sleep(0.5)
        console.print(f"[red]server exited[/] (see {spec.log_path})")
        raise typer.Exit(1)
    except KeyboardInterrupt:
        console.print("stopping the server tree")
    finally:
        eng.stop()


def sleep_command(level: int = typer.Option(2, "--level", min=0, max=2, help="1: the KV cache released; 2: "
                                         "the weights too (what a checkpoint uses)"), url: str = URL,
                  token: Optional[str] = TOKEN) -> None:
    """Put the engine to sleep (1: KV cache released; 2: weights too)."""
    print(json.dumps(_client(url, token).sleep(level)))


def wake_command(tags: Optional[List[str]] = typer.Option(None, "--tags", help="weights and/or kv_cache "
                                                          "(default: all)"), url: str = URL,
                 token: Optional[str] = TOKEN) -> None:
    """Wake the engine (released pages come back zero-filled: reload the weights next)."""
    print(json.dumps(_client(url, token).wake_up(tags or None)))


def reload_command(flat: Optional[Path] = typer.Argument(None, help="flat dump dir (default: found from "
                                                          "the model)"),
                   threads: Optional[int] = typer.Option(None, "--threads", help="loader readers (default: "
                                                         "8 on CPU, 8-16 by CPU count on CUDA)"),
                   mode: str = typer.Option("auto", "--mode", help="map (file mapped over the weight arena, CPU) "
                                            "| copy (our parallel loader) | auto (map if the layout matches)"),
                   packed: bool = typer.Option(True, "--packed/--no-packed", help="after sleep level 2, map the "
                                               "packed handles' buffers back from a packed dump beside the flat "
                                               "dump (engine dump-packed) where one matches; --no-packed packs anew"),
                   url: str = URL, token: Optional[str] = TOKEN) -> None:
    """Refill the weights from a flat dump: mapped over the weight arena, or copied in place."""
    args = [str(flat.resolve())] if flat else []
    res = _client(url, token).collective_rpc("coldstart_reload", args=args, kwargs={"threads": threads, "mode": mode,
                                                                           "packed": packed})
    _print_answers(res)


def dump_weights_command(out: Path = typer.Argument(..., help="new directory for weights.flat + index"),
                         url: str = URL, token: Optional[str] = TOKEN) -> None:
    """Dump the live model's tensors (kernel format) to the flat format."""
    print(json.dumps(_client(url, token).collective_rpc("coldstart_dump_weights", args=[str(out.resolve())]),
                     indent=1))


def dump_packed_command(flat: Optional[Path] = typer.Argument(None, help="the flat dump the handles were packed "
                                                                     "from (default: found from the model)"),
                        url: str = URL, token: Optional[str] = TOKEN) -> None:
    """Write the packed GEMM handles' buffers beside the flat dump they were packed from
    (<flat>/packed-<signature>): a reload from that dump after sleep level 2 then maps them back
    instead of packing every weight again (oneDNN handles; docs/engine.md)."""
    _print_answers(_client(url, token).collective_rpc("coldstart_dump_packed",
                                                    kwargs={"path": str(flat.resolve()) if flat else None}))


def complete_command(prompt: str = typer.Argument(..., help="the prompt"),
                     max_tokens: int = typer.Option(16, "--max-tokens", help="tokens to generate (greedy)"),
                     seed: int = typer.Option(0, "--seed", help="the request's sampling seed"), url: str = URL,
                     token: Optional[str] = TOKEN) -> None:
    """Greedy completion; prints the text and the token ids."""
    c = _client(url, token).complete(prompt, max_tokens=max_tokens, seed=seed)
    print(json.dumps({"text": c.text, "token_ids": c.token_ids}))


def state_command(url: str = URL, token: Optional[str] = TOKEN) -> None:
    """Our worker's state: sleeping tags, RSS, weights and KV bytes, last sleep's figures."""
    print(json.dumps(_client(url, token).collective_rpc("coldstart_state"), indent=1))


def register(app: typer.Typer, bench: typer.Typer) -> None:
    sub = typer.Typer(help="The vLLM server: start it checkpointable, sleep/wake/reload it, query it.",
                      no_args_is_help=True)
    sub.command("serve", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(serve_command)
    sub.command("sleep")(sleep_command)
    sub.command("wake")(wake_command)
    sub.command("reload")(reload_command)
    sub.command("dump-weights")(dump_weights_command)
    sub.command("dump-packed")(dump_packed_command)
    sub.command("complete")(complete_command)
    sub.command("state")(state_command)
    app.add_typer(sub, name="engine")
