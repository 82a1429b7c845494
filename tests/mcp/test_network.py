"""The network allowlist (`network:` as a map): a confined command reaches exactly the hosts
the operator allows, through the proxy the shell backend runs for it.

Real clients (curl over HTTP and over HTTPS through CONNECT, git, Python's urllib, pip)
run in the real confined shell against servers this module starts on loopback addresses;
names are answered by a DNS server it runs (dnslib), so the rules are tested with names,
not only addresses. `127.0.0.2` is the allowed server's address; `127.0.0.3` serves the same
pages but is private and not in `allowPrivate`; `127.0.0.4` is in a `deny` rule."""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import shutil
import ssl
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme
from conftest import Workspace, eventually, required_env, show, text
from dnslib import QTYPE, RR, A
from dnslib.server import BaseResolver, DNSLogger, DNSServer
from test_http import connect, servers, start  # noqa: F401  (`servers` is a fixture)

ALLOWED = "127.0.0.2"
PRIVATE = "127.0.0.3"
DENIED_ADDRESS = "127.0.0.4"
PAGE = "hello from the allowed host"


class Zone(BaseResolver):
    """The test's names. `flip.test` answers `ALLOWED` and then `PRIVATE`, with TTL 0 (a
    DNS rebinding); every other name has one fixed A record and no AAAA."""

    def __init__(self) -> None:
        self.fixed = {
            "allowed.test": ALLOWED,
            "a.b.wild.test": ALLOWED,
            "wild.test": ALLOWED,
            "denied.test": ALLOWED,
            "unlisted.test": ALLOWED,
            "private.test": PRIVATE,
            "deniedaddr.test": DENIED_ADDRESS,
        }
        self.flips = 0
        self.lock = threading.Lock()

    def resolve(self, request: Any, handler: Any) -> Any:
        reply = request.reply()
        name = str(request.q.qname).rstrip(".")
        if request.q.qtype != QTYPE.A:
            return reply
        if name == "flip.test":
            with self.lock:
                address = ALLOWED if self.flips % 2 == 0 else PRIVATE
                self.flips += 1
        elif name in self.fixed:
            address = self.fixed[name]
        else:
            return reply
        reply.add_answer(RR(name, QTYPE.A, rdata=A(address), ttl=0))
        return reply


class Site(http.server.SimpleHTTPRequestHandler):
    """Serves the site directory; answers POST too (so a refusal is the proxy's)."""

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        body = b"posted\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def make_site(root: Path) -> Path:
    """The page, a simple index with one wheel for pip, and a bare repository served by dumb
    HTTP for git."""
    site = root / "site"
    site.mkdir()
    (site / "index.html").write_text(PAGE + "\n")
    wheel = "tinypkg-1.0-py3-none-any.whl"
    package = site / "simple" / "tinypkg"
    package.mkdir(parents=True)
    with zipfile.ZipFile(package / wheel, "w") as z:
        z.writestr("tinypkg/__init__.py", "VALUE = 1\n")
        z.writestr("tinypkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n")
        z.writestr("tinypkg-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr("tinypkg-1.0.dist-info/RECORD", "")
    (package / "index.html").write_text(f'<html><body><a href="{wheel}">{wheel}</a></body></html>\n')
    (site / "simple" / "index.html").write_text('<html><body><a href="tinypkg/">tinypkg</a></body></html>\n')
    work = root / "repo-work"
    work.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q", str(work)], check=True)
    (work / "README").write_text("cloned through the proxy\n")
    subprocess.run([*git, "-C", str(work), "add", "README"], check=True)
    subprocess.run([*git, "-C", str(work), "commit", "-qm", "one"], check=True)
    subprocess.run([*git, "clone", "-q", "--bare", str(work), str(site / "repo.git")], check=True)
    subprocess.run(["git", "-C", str(site / "repo.git"), "update-server-info"], check=True)
    return site


def serve(
    address: str, site: Path, context: ssl.SSLContext | None = None, port: int = 0
) -> http.server.ThreadingHTTPServer:
    handler = lambda *a: Site(*a, directory=str(site))  # noqa: E731
    server = http.server.ThreadingHTTPServer((address, port), handler)
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@dataclass
class Net:
    zone: Zone
    dns_port: int
    http_port: int
    https_port: int
    ca: Path
    base: Path

    def manifest(self, isolated: bool = True, **network: Any) -> str:
        rules = {
            "allow": [
                "allowed.test",
                "*.wild.test",
                "denied.test",
                "private.test",
                "deniedaddr.test",
                "flip.test",
            ],
            "deny": ["denied.test", f"{DENIED_ADDRESS}/32"],
            "allowPrivate": [f"{ALLOWED}/32", f"{DENIED_ADDRESS}/32"],
            "resolver": f"127.0.0.1:{self.dns_port}",
            **network,
        }
        return (
            "- name: dsh-sandbox-policy\n  config:\n    mode: workspace-write\n"
            f"    network: {json.dumps(rules)}\n"
            "- name: dsh-bash-sandbox\n"
            + ("  isolate: process\n" if isolated else "")
            + "- name: dsh-tool-bash\n"
        )


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Net]:
    base = tmp_path_factory.mktemp("net")
    site = make_site(base)
    zone = Zone()
    quiet = DNSLogger(log="-recv,-send,-request,-reply,-truncated,-error,-data")
    dns = DNSServer(zone, port=0, address="127.0.0.1", logger=quiet)
    dns.start_thread()
    authority = trustme.CA()
    ca = base / "ca.pem"
    authority.cert_pem.write_to_path(str(ca))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    authority.issue_cert("allowed.test").configure_cert(context)
    plain = serve(ALLOWED, site)
    port = plain.server_address[1]
    # The same pages on the private and the denied address, same port: a refusal there is
    # the proxy's, never a closed port.
    others = [serve(PRIVATE, site, port=port), serve(DENIED_ADDRESS, site, port=port)]
    tls = serve(ALLOWED, site, context)
    try:
        yield Net(zone, dns.server.server_address[1], port, tls.server_address[1], ca, base)
    finally:
        for s in [plain, tls, *others]:
            s.shutdown()
        dns.stop()


@dataclass
class Ran:
    exit_code: int | None
    stdout: str
    stderr: str
    session: str


def call(ws: Workspace, command: str, *extra: str) -> Ran:
    """`cordis call bash` in a new session rooted at the project `p` (or the one `extra` names)."""
    out = subprocess.run(
        [
            required_env("CORDIS_BIN"),
            "call",
            "-c",
            str(ws.root / "cordis.yml"),
            "--state-dir",
            str(ws.root / "state"),
            "--cwd",
            str(ws.project("p")),
            "--format",
            "json",
            *extra,
            "bash",
            json.dumps({"command": command}),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.stdout.strip(), f"cordis call printed nothing; stderr:\n{out.stderr}"
    result = json.loads(out.stdout.splitlines()[0])
    structured = result.get("structuredContent") or {}
    assert "stdout" in structured, result
    return Ran(structured.get("exit_code"), structured["stdout"], structured["stderr"], result["session"])


def curl(url: str, *flags: str) -> str:
    """A curl that prints the body, then the status on a line of its own."""
    return f"curl -sS -m 20 {' '.join(flags)} -w '\\nstatus=%{{http_code}}\\n' '{url}'"


@pytest.mark.parametrize("isolated", [True, False], ids=["isolated", "in-process"])
def test_allowed_names_and_wildcards_answer_over_http_and_https(ws: Workspace, net: Net, isolated: bool) -> None:
    ws.manifest(net.manifest(isolated))
    (ws.project("p") / "ca.pem").write_bytes(net.ca.read_bytes())
    r = call(
        ws,
        "; ".join(
            [
                curl(f"http://allowed.test:{net.http_port}/"),
                curl(f"http://a.b.wild.test:{net.http_port}/"),
                curl(f"https://allowed.test:{net.https_port}/", "--cacert ca.pem"),
                "env | grep -ci '^[a-z_]*proxy='",
            ]
        ),
    )
    assert r.stdout.count(PAGE) == 3, r
    assert r.stdout.count("status=200") == 3, r
    # HTTP_PROXY, HTTPS_PROXY, ALL_PROXY and NO_PROXY, in both spellings.
    assert r.stdout.rstrip().endswith("8"), r


def test_denied_and_unlisted_hosts_get_the_proxys_403_naming_the_rule(ws: Workspace, net: Net) -> None:
    ws.manifest(net.manifest())
    cases = {
        "denied.test": "deny denied.test",
        "unlisted.test": "not in `allow`",
        # `*.wild.test` is strictly beneath: the name itself is not listed.
        "wild.test": "not in `allow`",
        "private.test": f"the address {PRIVATE} is loopback",
        "deniedaddr.test": f"deny {DENIED_ADDRESS}/32 (the address is {DENIED_ADDRESS})",
    }
    for host, rule in cases.items():
        r = call(ws, curl(f"http://{host}:{net.http_port}/"))
        assert "status=403" in r.stdout and rule in r.stdout, (host, r)
        assert PAGE not in r.stdout, (host, r)
    # HTTPS: the refusal is the answer to CONNECT, so nothing reaches TLS.
    r = call(ws, curl(f"https://denied.test:{net.https_port}/", "-k"))
    assert "CONNECT tunnel failed, response 403" in r.stderr and PAGE not in r.stdout, r
    # A literal address is subject to the same address checks as a resolved one.
    r = call(ws, curl(f"http://{PRIVATE}:{net.http_port}/"))
    assert "status=403" in r.stdout and "not in `allow`" in r.stdout, r


def test_a_name_rebinding_to_a_private_address_is_refused_after_resolution(ws: Workspace, net: Net) -> None:
    ws.manifest(net.manifest())
    with net.zone.lock:
        net.zone.flips = 0
    url = f"http://flip.test:{net.http_port}/"
    r = call(ws, f"{curl(url)}; {curl(url)}")
    # The first answer's page, its status and the second answer's body, the second status.
    parts = r.stdout.split("status=")
    assert len(parts) == 3, r
    assert PAGE in parts[0] and parts[1].startswith("200"), r
    assert f"the address {PRIVATE} is loopback" in parts[1] and PAGE not in parts[1], r
    assert parts[2].startswith("403"), r


def test_nothing_leaves_the_namespace_but_the_proxy(ws: Workspace, net: Net) -> None:
    ws.manifest(net.manifest())
    probe = (
        "import socket\n"
        "for target in [('%s', %d), ('8.8.8.8', 53), ('1.1.1.1', 443)]:\n"
        "    try:\n"
        "        socket.create_connection(target, timeout=5).close(); print('reached', target)\n"
        "    except OSError as e:\n"
        "        print('refused', target, e.errno)\n"
        "try:\n"
        "    print('resolved', socket.getaddrinfo('allowed.test', 80))\n"
        "except OSError as e:\n"
        "    print('no dns', e)\n"
        "try:\n"
        "    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); print('unix socket')\n"
        "except OSError as e:\n"
        "    print('no unix socket', e.errno)\n"
    ) % (ALLOWED, net.http_port)
    (ws.project("p") / "probe.py").write_text(probe)
    r = call(ws, f"{curl(f'http://{ALLOWED}:{net.http_port}/', '--noproxy', chr(39) + '*' + chr(39))}; {sys.executable} probe.py")
    assert PAGE not in r.stdout and "reached" not in r.stdout, r
    assert "Failed to connect" in r.stderr or "Couldn't connect" in r.stderr, r
    assert r.stdout.count("refused") == 3 and "no dns" in r.stdout and "no unix socket" in r.stdout, r


def test_python_pip_and_git_go_through_the_proxy(ws: Workspace, net: Net) -> None:
    ws.manifest(net.manifest())
    base = f"http://allowed.test:{net.http_port}"
    commands = [
        f"{sys.executable} -c \"import urllib.request; print(urllib.request.urlopen('{base}/').read().decode())\"",
        f"{sys.executable} -m pip download -q --no-deps --no-cache-dir --disable-pip-version-check --trusted-host allowed.test --index-url {base}/simple/ tinypkg -d dl && ls dl",
        f"git clone -q {base}/repo.git cloned && cat cloned/README",
    ]
    r = call(ws, " && ".join(commands))
    assert r.exit_code == 0, r
    assert PAGE in r.stdout, r
    assert "tinypkg-1.0-py3-none-any.whl" in r.stdout, r
    assert "cloned through the proxy" in r.stdout, r


def test_limited_lets_only_plain_get_head_and_options_through(ws: Workspace, net: Net) -> None:
    ws.manifest(net.manifest(limited=True))
    url = f"http://allowed.test:{net.http_port}/"
    r = call(ws, f"{curl(url)}; {curl(url, '-I')}; {curl(url, '-d x=1')}; {curl(f'https://allowed.test:{net.https_port}/', '-k')}")
    assert r.stdout.count(PAGE) == 1 and "posted" not in r.stdout, r
    assert "status=403" in r.stdout and "`limited` is on" in r.stdout, r
    assert "CONNECT tunnel failed, response 403" in r.stderr, r
    # Without `limited` the same POST is answered by the server: the refusal was the proxy's.
    ws.manifest(net.manifest())
    r = call(ws, curl(url, "-d x=1"))
    assert "posted" in r.stdout, r


def test_every_decision_is_in_the_session_log(ws: Workspace, net: Net) -> None:
    ws.manifest(net.manifest())
    r = call(ws, f"{curl(f'http://allowed.test:{net.http_port}/')}; {curl(f'http://unlisted.test:{net.http_port}/')}")
    shown = subprocess.run(
        [required_env("CORDIS_BIN"), "session", "show", r.session, "-c", str(ws.root / "cordis.yml"), "--state-dir", str(ws.root / "state")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"allowed GET allowed.test:{net.http_port} (allow allowed.test)" in shown, shown
    assert f"refused GET unlisted.test:{net.http_port}" in shown and "not in `allow`" in shown, shown


def test_a_bad_rule_is_refused_with_the_entry_named(ws: Workspace, net: Net) -> None:
    ws.manifest(net.manifest(allow=["exa mple.test"]))
    out = subprocess.run(
        [required_env("CORDIS_BIN"), "check", "-c", str(ws.root / "cordis.yml")],
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0, out
    assert "`network.allow`: `exa mple.test` is not a host name" in out.stderr + out.stdout, out


# --- ask: a person approves an unlisted host for the rest of the session -------------------


class HostApprover:
    def __init__(self, approve: bool) -> None:
        self.approve = approve
        self.messages: list[str] = []

    async def __call__(self, _context: Any, params: Any) -> Any:
        from mcp.types import ElicitResult

        self.messages.append(params.message)
        return ElicitResult(action="accept", content={"approve": self.approve})


async def test_ask_puts_an_unlisted_host_to_a_person_and_an_approval_lasts_the_session(
    ws: Workspace, net: Net, servers: list[Any]  # noqa: F811
) -> None:
    manifest = ws.manifest(net.manifest(allow=[], ask=True))
    server = await start(servers, ws)
    url = f"http://allowed.test:{net.http_port}/"
    project = ws.project("p")
    yes, no = HostApprover(True), HostApprover(False)
    async with connect(server.url, roots=[project], elicitation=no) as s:
        r = await s.call_tool("bash", {"command": curl(url)})
        assert "status=403" in text(r) and "the user did not approve it" in text(r), show(r)
        assert len(no.messages) == 1 and f"allowed.test:{net.http_port}" in no.messages[0], no.messages
    async with connect(server.url, roots=[project], elicitation=yes) as s:
        r = await s.call_tool("bash", {"command": curl(url)})
        assert PAGE in text(r), show(r)
        assert len(yes.messages) == 1 and f"allowed.test:{net.http_port}" in yes.messages[0], yes.messages
        # A reload (the policy's config changed) keeps the approval: it is a session event.
        before = server.count(r"reload: ")
        tmp = manifest.with_suffix(".tmp")
        tmp.write_text(net.manifest(allow=[], ask=True, deny=["nothing.test"]))
        tmp.replace(manifest)
        await eventually("the reload", 30, lambda: server.count(r"reload: ") > before)
        r = await s.call_tool("bash", {"command": curl(url)})
        assert PAGE in text(r), show(r)
        assert len(yes.messages) == 1, yes.messages
        # The approval was for that host and port only.
        r = await s.call_tool("bash", {"command": curl(f"http://unlisted.test:{net.http_port}/")})
        assert len(yes.messages) == 2 and "unlisted.test" in yes.messages[1], yes.messages
