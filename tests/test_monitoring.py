"""deploy/prometheus and deploy/grafana against the real thing: a Prometheus (Debian's `prometheus`,
installed by .ci/run) scrapes a running tritonserver that serves two trtspec models, the shipped
tiny DFlash and the same target with a drafter of random weights (τ ≈ 1), and the shipped one's
OpenAI frontend. promtool checks every expression of the dashboard and the rules; each one returns
data after a few requests; the acceptance-collapse alert fires for the bad drafter and stays silent
for the shipped one, the frontend's refusal alert for the route it refused; the alerts' `for:`
timing is unit-tested with `promtool test rules`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request

import pytest
import torch
import yaml
from google.protobuf import text_format
from safetensors.torch import load_file, save_file
from tritonclient.grpc import model_config_pb2 as mc

from trtspec.config import ASSETS_DIR, LookupConfig, ScheduleConfig, load_build_config
from trtspec.openai.model_info import served_model_of_repo
from trtspec.openai.server import OpenAIFrontend
from trtspec.triton.client import GenerateParams, generate
from trtspec.triton.repo import REPO_DIR, write_triton_repo
from trtspec.triton.server import Ports, TritonServer

from .conftest import REPO, free_ports, post_json

DEPLOY = REPO / "deploy"
RULES = DEPLOY / "prometheus" / "rules" / "trtspec.yaml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "trtspec.json"
GOOD, BAD = "trtspec", "trtspec-bad"
PROMPTS = ("Q: 482 + 356\nA:", "def parse(self, text):\n", "import os\n")
REFUSED = 6  # chat requests the frontend refuses, past the alert's least of 5 in 10 minutes


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not installed: .ci/run installs Debian's prometheus package")
        pytest.skip(f"{name} not installed (apt-get install prometheus)")
    return path


def dashboard_exprs() -> list[str]:
    """Every panel query, with Grafana's variables as a test can give them."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    return [e.replace("$model", ".*").replace("$__rate_interval", "1m") for e in exprs]


def rule_exprs() -> list[tuple[str, str]]:
    rules = yaml.safe_load(RULES.read_text())["groups"][0]["rules"]
    return [(r.get("alert") or r["record"], r["expr"].strip()) for r in rules]


def test_promtool_checks_rules_config_and_every_dashboard_expression(tmp_path):
    promtool = _tool("promtool")
    subprocess.run([promtool, "check", "rules", str(RULES)], check=True, capture_output=True)
    subprocess.run([promtool, "check", "config", str(DEPLOY / "prometheus" / "prometheus.yml")], check=True,
                   capture_output=True)
    # PromQL of the dashboard, checked by the same parser as recording rules
    as_rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:expr{i}", "expr": e} for i, e in enumerate(dashboard_exprs())]}]}
    (tmp_path / "dashboard.yaml").write_text(yaml.safe_dump(as_rules))
    out = subprocess.run([promtool, "check", "rules", str(tmp_path / "dashboard.yaml")], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{len(dashboard_exprs())} rules found" in out.stdout
    # and a broken expression is refused, so the check above means something
    (tmp_path / "broken.yaml").write_text(yaml.safe_dump(
        {"groups": [{"name": "x", "rules": [{"record": "x:y", "expr": "sum by (model) (rate(x[5m])"}]}]}))
    assert subprocess.run([promtool, "check", "rules", str(tmp_path / "broken.yaml")],
                          capture_output=True).returncode != 0


def test_promtool_unit_tests_of_the_alerts():
    promtool = _tool("promtool")
    unit_tests = DEPLOY / "prometheus" / "tests" / "trtspec_test.yaml"
    out = subprocess.run([promtool, "test", "rules", str(unit_tests)], capture_output=True, text=True)
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr


def _random_drafter(tmp_path):
    """tiny-dflash-b16 with every weight redrawn (seeded): the same shapes, proposals the target
    almost never accepts."""
    src, dst = ASSETS_DIR / "tiny-dflash-b16", tmp_path / "random-dflash"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("acceptance.json"))
    gen = torch.Generator().manual_seed(7)
    weights = {name: torch.randn(t.shape, generator=gen, dtype=torch.float32).to(t.dtype) * 0.05
               for name, t in load_file(dst / "model.safetensors").items()}
    save_file(weights, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def _two_instances(model_dir) -> None:
    """Serve the model with two CPU instances, as `gpus: [0, 1]` gives one per GPU."""
    path = model_dir / "config.pbtxt"
    pb = text_format.Parse(path.read_text(), mc.ModelConfig())
    pb.instance_group[0].count = 2
    path.write_text(text_format.MessageToString(pb))


class Prometheus:
    def __init__(self, binary: str, work, metrics_port: int, frontend_port: int, port: int):
        self.port = port
        rules = yaml.safe_load(RULES.read_text())
        for rule in rules["groups"][0]["rules"]:
            if "alert" in rule:
                rule["for"] = "0s"  # the real `for:` is covered by promtool test rules
        (work / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(work / "rules.yaml")],
            "scrape_configs": [
                {"job_name": "trtspec", "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}]},
                {"job_name": "trtspec-frontend",
                 "static_configs": [{"targets": [f"127.0.0.1:{frontend_port}"]}]}],
        }
        (work / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = open(work / "prometheus.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [binary, f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                log = (work / "prometheus.log").read_text()[-2000:]
                raise RuntimeError(f"prometheus did not start: {log}")
            time.sleep(0.3)

    def query(self, expr: str) -> list[dict]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]["result"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def scraped(tmp_path_factory):
    """tritonserver with the shipped drafter (two instances) and the random one, the OpenAI frontend
    of the shipped one, Prometheus scraping both, a few requests (REFUSED of them refused by the
    frontend). Both drafters verify whole blocks (`schedule: full`): the adaptive schedule
    would first measure each drafter's cost model at start (the random one's weights are another
    cache key), and what is watched here is the same either way. The shipped one copies by prompt
    lookup too, with a pool (its requests repeat one another), so the copied counters move."""
    binary = _tool("prometheus")
    work = tmp_path_factory.mktemp("monitoring")
    config = load_build_config(REPO / "build_configs" / "tiny-dflash.yaml")
    config.drafter = config.drafter.model_copy(update={"schedule": ScheduleConfig(mode="full")})
    config.lookup = LookupConfig(num_draft_tokens=16, min_match=4, max_match=32, pool_tokens=4096)
    write_triton_repo(config, work / "build")
    _two_instances(work / "build" / REPO_DIR / GOOD)
    bad = config.model_copy(update={"name": BAD, "lookup": None})
    bad.drafter = bad.drafter.model_copy(update={"path": str(_random_drafter(work))})
    write_triton_repo(bad, work / "build")
    # five distinct ports: Prometheus binds its own (scraping nothing yet) before the server and the
    # frontend bind theirs
    *three, frontend_port, prometheus_port = free_ports(5)
    server = TritonServer(work / "build" / REPO_DIR, ports=Ports(*three), exit_timeout_s=3,
                          env={"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})
    prometheus = Prometheus(binary, work, server.ports.metrics, frontend_port, prometheus_port)
    frontend = None
    try:
        server.start(timeout_s=240)
        only_good = work / "good"  # the frontend serves one model: the shipped drafter's
        only_good.mkdir()
        (only_good / GOOD).symlink_to(work / "build" / REPO_DIR / GOOD)
        frontend = OpenAIFrontend(served_model_of_repo(only_good), server.local_grpc_address, "127.0.0.1",
                                  frontend_port).start()
        # rate() needs a sample from before the requests: wait for the first scrape of both models
        assert len(_wait_for(prometheus, "trtspec_requests_total == 0")) == 2, "no scrape of the server"
        params = GenerateParams(max_tokens=24)
        for model in (GOOD, BAD):
            for prompt in PROMPTS:
                generate(server.grpc_url, model, prompt, GenerateParams(max_tokens=24, stream=True))
                generate(server.http_url, model, prompt, params)
        # what the frontend answers: one completion, and REFUSED chat requests it refuses itself
        assert post_json(f"{frontend.url}/v1/completions", {"model": GOOD, "prompt": PROMPTS[0],
                                                              "max_tokens": 8})[0] == 200
        for i in range(REFUSED):
            status, body = post_json(f"{frontend.url}/v1/chat/completions", {
                "model": GOOD, "messages": [{"role": "user", "content": "hi"}], "client_metadata": {}})
            assert status == 400 and body["error"]["param"] == "client_metadata", body
            if i == 0:  # a series is born at its first count: rate() sees the others once it holds that
                assert _wait_for(prometheus, 'sum(trtspec_frontend_requests_total{status="400"}) == 1')
        assert _wait_for(prometheus, f'sum(trtspec_frontend_requests_total{{status="400"}}) == {REFUSED}')
        with pytest.raises(Exception, match="max_tokens"):  # one invalid request: the error counter moves
            generate(server.http_url, GOOD, PROMPTS[0], GenerateParams(max_tokens=0))
        # the invalid request came last: once Prometheus holds it, it holds every request before it
        assert _wait_for(prometheus, 'sum(trtspec_request_errors_total{reason="invalid_request"}) == 1')
        yield prometheus
    finally:
        prometheus.stop()
        if frontend is not None:
            frontend.stop()
        server.stop()


def _wait_for(prometheus: Prometheus, expr: str, timeout_s: float = 60) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while True:
        result = prometheus.query(expr)
        if result or time.monotonic() > deadline:
            return result
        time.sleep(1)


def test_acceptance_collapse_fires_for_the_bad_drafter_only(scraped):
    firing = _wait_for(scraped, 'ALERTS{alertname="TrtspecAcceptanceCollapse", alertstate="firing"}')
    assert {a["metric"]["model"] for a in firing} == {BAD}
    rates = {r["metric"]["model"]: float(r["value"][1])
             for r in scraped.query("trtspec:acceptance_rate:rate5m")}
    assert rates[BAD] < 0.05 < 0.1 < rates[GOOD], rates
    # one invalid request among the good model's 8 is 12 % > 5 %: its error alert fires, the bad
    # drafter's (no errors) does not, and no request waited for a slot long enough to alert
    errors = _wait_for(scraped, 'ALERTS{alertname="TrtspecErrorRateHigh", alertstate="firing"}')
    assert {a["metric"]["model"] for a in errors} == {GOOD}
    assert scraped.query('ALERTS{alertname="TrtspecQueueTimeHigh"}') == []


def test_frontend_refusing_fires_for_the_refused_route_only(scraped):
    """Every chat request was refused (a field the frontend does not take), the one completion
    answered: the frontend's alert fires for chat's route alone."""
    firing = _wait_for(scraped, 'ALERTS{alertname="TrtspecFrontendRefusing", alertstate="firing"}')
    assert {a["metric"]["route"] for a in firing} == {"/v1/chat/completions"}
    refusals = scraped.query("sum by (route, param) (trtspec_frontend_refusals_total)")
    assert [(r["metric"]["route"], r["metric"]["param"], r["value"][1]) for r in refusals] == [
        ("/v1/chat/completions", "client_metadata", str(REFUSED))]


def test_each_instance_reports_its_own_load(scraped):
    """Triton gives every instance of a model the same series for the same labels: counters add up,
    but a gauge set by one instance would hide the other's requests, so each has its own."""
    for gauge in ("trtspec_requests_in_flight", "trtspec_requests_waiting"):
        series = scraped.query(f'{gauge}{{model="{GOOD}"}}')
        assert sorted(s["metric"].get("model_instance") for s in series) == [f"{GOOD}_0_0", f"{GOOD}_0_1"]


def test_every_expression_returns_data_from_the_server(scraped):
    _wait_for(scraped, "trtspec:acceptance_rate:rate5m")
    exprs = dashboard_exprs() + [e for _, e in rule_exprs()]
    empty = []
    for expr in exprs:
        # an alert's threshold keeps it empty while healthy: ask for the quantity it compares
        quantity = re.sub(r"\s*[<>]=?\s*[0-9.]+\s*$", "", expr)
        if not _wait_for(scraped, quantity, timeout_s=10):
            empty.append(quantity)
    assert empty == []
    steps = scraped.query(f'sum(trtspec_target_forwards_total{{model="{GOOD}"}}) '
                          f'/ sum(trtspec_batch_steps_total{{model="{GOOD}"}})')
    assert float(steps[0]["value"][1]) >= 1  # one packed forward serves at least one request
    copied = scraped.query(f'sum by (source) (trtspec_copied_accepted_tokens_total{{model="{GOOD}"}}) '
                           f'/ sum by (source) (trtspec_copied_draft_tokens_total{{model="{GOOD}"}})')
    acceptance = {r["metric"]["source"]: float(r["value"][1]) for r in copied}
    assert 0 < acceptance["lookup"] <= 1 and 0 < acceptance["pool"] <= 1, acceptance
