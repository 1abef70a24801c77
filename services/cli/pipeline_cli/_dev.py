"""``pipeline dev up|down|status|env|user``: a real local Apache Kafka (KRaft) without Docker."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import click

from . import devbroker
from ._devdata import check_heap
from ._output import REQUEST_MAX_S, Seconds, cli_errors, json_option, print_json, print_table

F = TypeVar("F", bound=Callable[..., Any])

_PORTS = (
    "Ports: one node serves clients on localhost:9092 (controller 9093); three nodes on 9092, "
    "9094, 9096 (controllers 9093, 9095, 9097). --port shifts them all: node i uses PORT+2i "
    "and PORT+2i+1."
)


def _exports(env: Mapping[str, str], hide: Mapping[str, str] | None = None) -> None:
    """``export NAME=value`` lines for a shell; ``hide`` gives shell words to print instead."""
    for name, value in env.items():
        word = (hide or {}).get(name) or shlex.quote(value)
        click.echo(f"export {name}={word}")


def stop_command(data_dir: Path) -> str:
    """The command that stops the cluster in ``data_dir``: with ``--data-dir`` unless it is the
    default one."""
    if data_dir == devbroker.default_data_dir().expanduser().resolve():
        return "pipeline dev down"
    return f"pipeline dev down --data-dir {shlex.quote(str(data_dir))}"


def _heap(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    try:
        check_heap(value)
    except devbroker.DevBrokerError as exc:
        raise click.BadParameter(str(exc)) from None
    return value


def _data_dir_option(command: F) -> F:
    return click.option(
        "--data-dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help="Where the nodes keep data, logs and pid files "
        "[default: $PIPELINE_DEV_DIR, else $XDG_STATE_HOME/pipeline/dev, "
        "else ~/.local/state/pipeline/dev].",
    )(command)


@click.group(
    name="dev",
    help=f"Run a real Apache Kafka (KRaft) on this machine, no Docker.\n\n"
    f"The broker jars come from Maven Central (fetched once with Maven, cached in "
    f"~/.cache/pipeline) and run on the machine's Java 17+. {_PORTS}",
)
def dev() -> None:
    pass


@dev.command(
    short_help="Start the local Kafka (or report the one running).",
    help="Start the local Kafka and wait until it serves; print its bootstrap servers.\n\n"
    "The last line printed is the bootstrap servers alone, so scripts can use "
    "`$(pipeline dev up | tail -1)`. A cluster that already runs is reported, not started twice; "
    "a stopped one restarts on its data (--fresh deletes it first). " + _PORTS + "\n\n"
    "--secure: clients connect with SASL_SSL and SCRAM-SHA-512 as user admin (a random password "
    "kept in the data dir), trusting a CA generated in the data dir; an authorizer denies what "
    "no ACL allows. The client settings are printed as `export PIPELINE_...` lines before the "
    "bootstrap servers (the password as `$(cat FILE)`; `pipeline dev env` and --json give it).",
)
@click.option(
    "--nodes",
    type=click.Choice(["1", "3"]),
    default=None,
    help="Number of combined broker+controller nodes [default: what the data dir holds, else 1].",
)
@_data_dir_option
@click.option(
    "--port",
    "base_port",
    type=click.IntRange(1024, 65530),
    default=None,
    help="First port; node i uses PORT+2i (clients) and PORT+2i+1 (controller) "
    "[default: what the data dir was started with, else 9092].",
)
@click.option("--fresh", is_flag=True, help="Stop the cluster and delete its data first.")
@click.option(
    "--secure",
    is_flag=True,
    default=None,
    help="TLS, SASL/SCRAM and ACLs: clients need the printed settings "
    "[default: what the data dir holds, else PLAINTEXT].",
)
@click.option(
    "--heap",
    default=None,
    callback=_heap,
    help="JVM heap per node, e.g. 2G [default: what the data dir was started with, else 1G, "
    "512m with 3 nodes].",
)
@click.option(
    "--timeout",
    type=Seconds(min=1, max=REQUEST_MAX_S),
    default=120.0,
    show_default=True,
    help="Seconds to wait for the brokers to answer (the one-time download is not counted).",
)
@json_option
def up(
    *,
    nodes: str | None,
    data_dir: Path | None,
    base_port: int | None,
    fresh: bool,
    secure: bool | None,
    heap: str | None,
    timeout: float,
    as_json: bool,
) -> None:
    def progress(message: str) -> None:
        click.echo(message, err=True)

    with cli_errors():
        cluster = devbroker.up(
            int(nodes) if nodes else None,
            data_dir,
            base_port,
            heap,
            timeout,
            fresh=fresh,
            progress=progress,
            secure=secure or None,
        )
        env = cluster.client_settings()
    if as_json:
        report = cluster.status().to_dict()
        print_json({**report, "already_running": cluster.already_running, "client_settings": env})
        return
    state = "already running" if cluster.already_running else "running"
    click.echo(
        f"Kafka {devbroker.KAFKA_VERSION} is {state}: {len(cluster.nodes)} node(s), "
        f"data in {cluster.data_dir}; stop it with `{stop_command(cluster.data_dir)}`.",
        err=True,
    )
    if cluster.secure:
        click.echo("Client settings (the admin, a super user):", err=True)
        hidden = f'"$(cat {shlex.quote(str(cluster.password_file))})"'
        _exports(env, {"PIPELINE_SECURITY__SASL_PASSWORD": hidden})
    click.echo(cluster.bootstrap_servers)


@dev.command(
    short_help="Print the admin's client settings (PIPELINE_* variables).",
    help="Print the client settings of the local cluster's admin as `export PIPELINE_...=...` "
    'lines, the password of a secured cluster included: `eval "$(pipeline dev env)"`.',
)
@_data_dir_option
@json_option
def env(data_dir: Path | None, as_json: bool) -> None:
    with cli_errors():
        settings = devbroker.client_settings(data_dir)
    if as_json:
        print_json(settings)
    else:
        _exports(settings)


@dev.group(help="SCRAM users of a secured local cluster (`pipeline dev up --secure`).")
def user() -> None:
    pass


@user.command(
    name="add",
    help="Create SCRAM-SHA-512 user NAME (or set its password) and print its client settings. "
    "It may do nothing until ACLs allow it something.",
)
@click.argument("name")
@click.option("--password", default=None, help="Its password [default: a random one, printed].")
@_data_dir_option
@json_option
def user_add(name: str, password: str | None, data_dir: Path | None, as_json: bool) -> None:
    with cli_errors():
        security = devbroker.add_user(name, password, data_dir)
        servers = devbroker.status(data_dir).bootstrap_servers
    settings = devbroker.client_env(servers, security)
    if as_json:
        print_json(settings)
    else:
        _exports(settings)


@dev.command(help="Stop the brokers started in the data dir (only those processes).")
@_data_dir_option
@click.option("--purge", is_flag=True, help="Also delete the data dir (topics, logs, everything).")
def down(data_dir: Path | None, purge: bool) -> None:
    where = (data_dir or devbroker.default_data_dir()).expanduser()
    existed = where.is_dir()
    with cli_errors():
        pids = devbroker.down(data_dir, purge=purge)
    if pids:
        click.echo(f"Stopped Kafka (pids {', '.join(map(str, pids))}).")
    else:
        click.echo(f"No Kafka was running from {where}.")
    if purge:
        click.echo(f"Deleted {where}." if existed else f"Nothing to delete: {where} is no folder.")


@dev.command(
    short_help="Show each node: pid, state, ports, log.",
    help="Show each node of the local cluster: pid, state, ports and log file.",
)
@_data_dir_option
@json_option
def status(data_dir: Path | None, as_json: bool) -> None:
    with cli_errors():
        report = devbroker.status(data_dir)
    if as_json:
        print_json(report.to_dict())
        return
    if not report.nodes:
        click.echo(f"No cluster in {report.data_dir}; start one with `pipeline dev up`.")
        return
    rows = [
        (
            n.index,
            n.node_id,
            n.pid,
            "running" if n.alive else "stopped",
            n.port,
            n.controller_port,
            str(n.log_file),
        )
        for n in report.nodes
    ]
    print_table(rows, ["node", "id", "pid", "state", "port", "controller", "log"])
    if report.running:
        click.echo(f"bootstrap servers: {report.bootstrap_servers}")
    if report.secure:
        click.echo("secured (SASL_SSL, SCRAM-SHA-512): `pipeline dev env` prints the settings")
