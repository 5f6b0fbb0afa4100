"""deploy/ without a container engine: the Dockerfiles parse (BuildKit's own parser, the `dockerfile`
package), every path they copy exists and is let through their .dockerignore, the commands they run
are real `trtspec` commands with valid options (click's parser), the compose file validates against
the Compose Specification schema, and the kustomize overlays build."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import click
import dockerfile
import pytest
import yaml
from click.testing import CliRunner

from trtspec.cli import main
from trtspec.config import load_build_config
from trtspec.plan.deployment import DeploymentConfig
from trtspec.plan.memory import check_fits, plan_memory

from .conftest import REPO

DOCKER = REPO / "deploy" / "docker"
# ids avoid the bare word "gpu": conftest skips tests marked (or named) gpu on machines without one
IMAGES = {"cpu-image": DOCKER / "cpu.Dockerfile", "gpu-image": DOCKER / "gpu.Dockerfile"}


def _commands(name: str) -> list[dockerfile.Command]:
    return list(dockerfile.parse_file(str(IMAGES[name])))


def _one(commands, instruction: str) -> dockerfile.Command:
    found = [c for c in commands if c.cmd == instruction]
    assert len(found) == 1, f"{instruction}: {found}"
    return found[0]


def _env(commands) -> dict[str, str]:
    env = {}
    for c in commands:
        if c.cmd == "ENV":
            env.update(zip(c.value[::2], c.value[1::2], strict=True))
    return env


def parse_trtspec(argv: list[str]) -> click.Context:
    """Resolve `trtspec SUB ...` through the real CLI's parser (no command runs); raises
    click.UsageError / NoSuchOption on an unknown command or option."""
    assert argv[0] == "trtspec", argv
    parent = click.Context(main, info_name="trtspec")
    name, sub, rest = main.resolve_command(parent, argv[1:])
    return sub.make_context(name, rest, parent=parent)


@pytest.mark.parametrize("name", IMAGES)
def test_dockerfile_parses_pins_its_base_runs_unprivileged_and_is_checked(name):
    commands = _commands(name)
    base = _one(commands, "FROM").value[0]
    if base.startswith("${"):  # the GPU image names its base in one ARG
        arg = _one(commands, "ARG").value[0]
        assert arg.startswith(base[2:-1] + "=")
        base = arg.split("=", 1)[1]
    image, _, tag = base.rpartition(":")
    assert image and tag and tag != "latest" and "/" not in tag, base
    user = _one(commands, "USER").value[0]
    assert re.fullmatch(r"[1-9][0-9]*(:[1-9][0-9]*)?", user), f"numeric non-root user, got {user!r}"
    assert _one(commands, "HEALTHCHECK").value[0] == "CMD"


def test_gpu_image_reads_checkpoints_from_a_models_volume():
    assert "/models" in _one(_commands("gpu-image"), "VOLUME").value


def test_no_volume_freezes_the_cpu_images_built_repository():
    """Docker copies an image's files into a volume only while the volume is empty: a volume (the
    Dockerfile's VOLUME, or compose's named one) over the repository the image builds keeps serving
    the first build's config.pbtxt / build_config.yaml after `docker compose up --build`."""
    commands = _commands("cpu-image")
    run = next(c.value[0] for c in commands if c.cmd == "RUN" and "trtspec build" in c.value[0])
    built = parse_trtspec(shlex.split(run.split("&&")[0])).params["out_dir"].as_posix()
    compose = yaml.safe_load((REPO / "deploy/compose.yaml").read_text())
    targets = [v.split(":")[1] for v in compose["services"]["trtspec"].get("volumes", [])]
    targets += [v for c in commands if c.cmd == "VOLUME" for v in c.value]
    covering = [t for t in targets if built == t or built.startswith(t.rstrip("/") + "/")]
    assert not covering, f"{built} (built into the image) lies under volume(s) {covering}"


@pytest.mark.parametrize("name", IMAGES)
def test_every_copied_path_exists_and_reaches_the_build_context(name):
    ignore = (DOCKER / f"{IMAGES[name].name}.dockerignore").read_text().splitlines()
    allowed = [line[1:].rstrip("/") for line in ignore if line.startswith("!")]
    assert ignore[ignore.index("*") if "*" in ignore else 0] == "*"  # deny by default
    for c in _commands(name):
        if c.cmd != "COPY" or any(f.startswith("--from") for f in c.flags):
            continue
        for src in c.value[:-1]:
            assert (REPO / src).exists(), f"{IMAGES[name].name}: COPY {src} does not exist"
            assert any(src == a or src.startswith(a + "/") or fnmatch.fnmatch(src, a) for a in allowed), (
                f"{src} is excluded by {IMAGES[name].name}.dockerignore")


def test_cpu_image_runs_a_real_trtspec_serve():
    commands = _commands("cpu-image")
    cmd = _one(commands, "CMD")
    assert cmd.json
    ctx = parse_trtspec(list(cmd.value))
    assert ctx.info_name == "serve" and ctx.params["build_dir"].as_posix() == "/models/tiny"
    assert ctx.params["host"] == "0.0.0.0"
    exposed = {int(p) for p in _one(commands, "EXPOSE").value}
    ports = {ctx.params[k] for k in ("http_port", "grpc_port", "metrics_port", "openai_port")}
    assert ports == exposed == {8000, 8001, 8002, 9000}


def test_cpu_image_build_step_is_a_real_trtspec_build(tmp_path):
    runs = [c.value[0] for c in _commands("cpu-image") if c.cmd == "RUN" and "trtspec build" in c.value[0]]
    argv = shlex.split(runs[0].split("&&")[0])
    ctx = parse_trtspec(argv)
    assert ctx.info_name == "build" and ctx.params["out_dir"].as_posix() == "/models/tiny"
    # the same build, run here into a temporary folder: it writes the repository `serve` reads
    result = CliRunner().invoke(main, ["build", str(REPO / argv[2]), "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "model_repository" / "trtspec" / "config.pbtxt").is_file()


def test_gpu_entrypoint_builds_a_real_trtllm_deployment(tmp_path):
    commands = _commands("gpu-image")
    env = _env(commands)
    assert _one(commands, "ENTRYPOINT").value == ("/opt/trtspec/gpu-entrypoint.sh",)
    assert _one(commands, "CMD").value == ("serve",)  # an argument of the generated launch.sh
    script = (DOCKER / "gpu-entrypoint.sh").read_text()
    line = next(x for x in script.splitlines() if x.startswith("trtspec "))
    argv = [re.sub(r"\$\{?(\w+)\}?", lambda m: env[m.group(1)], a) for a in shlex.split(line)]
    ctx = parse_trtspec(argv)
    assert ctx.info_name == "build" and ctx.params["flavour"] == "trtllm"
    assert str(ctx.params["config_path"]) == env["TRTSPEC_CONFIG"]
    # the entrypoint's build on the overlay's example config, here: it writes the launcher it execs
    config = REPO / "deploy" / "k8s" / "overlays" / "gpu" / "build.yaml"
    result = CliRunner().invoke(main, ["build", str(config), "--out", str(tmp_path), "--flavour", "trtllm"])
    assert result.exit_code == 0, result.output
    launch = tmp_path / "deploy" / "launch.sh"
    assert os.access(launch, os.X_OK) and "serve)" in launch.read_text()
    spec = yaml.safe_load((tmp_path / "trtllm-serve.yaml").read_text())["speculative_config"]
    assert spec["draft_len_schedule"] and spec["acceptance_rate_threshold"] > 0


def test_gpu_base_image_is_named_in_one_place():
    arg = _one(_commands("gpu-image"), "ARG").value[0]
    tag = arg.split("=", 1)[1]
    hits = []
    for path in list((REPO / "deploy").rglob("*")) + [REPO / "README.md", *(REPO / "docs").rglob("*.md")]:
        if path.is_file() and "tritonserver:" in path.read_text(errors="ignore"):
            hits += [(path, m) for m in re.findall(r"tritonserver:[\w.\-]+", path.read_text(errors="ignore"))]
    assert hits == [(IMAGES["gpu-image"], "tritonserver:" + tag.split("tritonserver:")[1])]
    # the image generated Kubernetes manifests run (`deployment.image`) was the untagged
    # nvcr.io/nvidia/tensorrt-llm/release, i.e. :latest, whatever TensorRT-LLM that is this week
    assert DeploymentConfig.model_fields["image"].default == tag
    for pinned in ("localhost:5000/trtllm:1.3.0", "nvcr.io/nvidia/tritonserver@sha256:" + "0" * 64):
        assert DeploymentConfig(gpu="H200", model_id="Qwen/Qwen3-8B", image=pinned).image == pinned


def test_compose_validates_and_mounts_what_exists(tmp_path):
    checker = shutil.which("check-jsonschema") or str(Path(sys.executable).parent / "check-jsonschema")
    assert Path(checker).is_file(), "check-jsonschema is a dev dependency (pyproject.toml)"
    compose = REPO / "deploy" / "compose.yaml"
    out = subprocess.run([checker, "--builtin-schema", "vendor.compose-spec", str(compose)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    spec = yaml.safe_load(compose.read_text())
    base = compose.parent
    app = spec["services"]["trtspec"]
    assert (base / app["build"]["context"] / app["build"]["dockerfile"]).resolve() == IMAGES["cpu-image"]
    for service in spec["services"].values():
        image = service.get("image", "")
        assert ":" in image and not image.endswith(":latest"), image
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (base / source).exists(), source
            else:
                assert source in spec["volumes"], source
    assert {int(p.split(":")[1]) for p in app["ports"]} == {8000, 8001, 8002, 9000}
    # the schema check is a real one: a misspelt key fails it
    broken = tmp_path / "compose.yaml"
    broken.write_text(compose.read_text().replace("services:", "servicez:", 1))
    assert subprocess.run([checker, "--builtin-schema", "vendor.compose-spec", str(broken)],
                          capture_output=True).returncode != 0


def test_grafana_provisioning_points_at_the_dashboard():
    provisioning = REPO / "deploy" / "grafana" / "provisioning"
    datasource = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())
    uid = datasource["datasources"][0]["uid"]
    dashboard = json.loads((REPO / "deploy/grafana/dashboards/trtspec.json").read_text())
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == uid and panel["targets"], panel["title"]
    provider = yaml.safe_load((provisioning / "dashboards" / "trtspec.yaml").read_text())
    compose = yaml.safe_load((REPO / "deploy/compose.yaml").read_text())
    mounts = dict(v.split(":")[:2] for v in compose["services"]["grafana"]["volumes"])
    assert mounts["./grafana/dashboards"] == provider["providers"][0]["options"]["path"]


KUSTOMIZE = REPO / "deploy" / "k8s"


@pytest.mark.parametrize("overlay", ["cpu-demo", "gpu"], ids=["cpu-demo-overlay", "gpu-overlay"])
def test_kustomize_overlays(overlay):
    root = KUSTOMIZE / "overlays" / overlay
    for folder in (KUSTOMIZE / "base", root):
        spec = yaml.safe_load((folder / "kustomization.yaml").read_text())
        files = spec.get("resources", []) + [p["path"] for p in spec.get("patches", [])]
        files += [f for g in spec.get("configMapGenerator", []) for f in g["files"]]
        for rel in files:
            assert (folder / rel).exists(), f"{folder / rel} is missing"
            if (folder / rel).is_file():
                assert all(d for d in yaml.safe_load_all((folder / rel).read_text()))
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (with its built-in kustomize) not installed; file references checked above")
    out = subprocess.run([kubectl, "kustomize", str(root)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    objects = {(o["kind"], o["metadata"]["name"].split("-")[0]): o for o in yaml.safe_load_all(out.stdout)}
    deployment = objects[("Deployment", "trtspec")]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    compose = yaml.safe_load((REPO / "deploy/compose.yaml").read_text())
    expected = compose["services"]["trtspec"]["image"].replace("cpu", "gpu" if overlay == "gpu" else "cpu")
    assert container["image"] == expected
    selector = objects[("Service", "trtspec")]["spec"]["selector"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= labels.items()
    if overlay == "gpu":
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
        config_map = next(o for o in yaml.safe_load_all(out.stdout) if o["kind"] == "ConfigMap")
        volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
        assert volumes["build-config"]["configMap"]["name"] == config_map["metadata"]["name"]


def _merged_container(overlay: str) -> dict:
    """The base Deployment's container with the overlay's patch applied as kustomize's strategic merge
    does for these files (maps merged key by key, the container list by name); enough to check the
    probes without kubectl."""

    def merge(base, patch):
        if not (isinstance(base, dict) and isinstance(patch, dict)):
            return patch
        return {**base, **{k: merge(base[k], v) if k in base else v for k, v in patch.items()}}

    base = yaml.safe_load((KUSTOMIZE / "base" / "deployment.yaml").read_text())
    container = base["spec"]["template"]["spec"]["containers"][0]
    root = KUSTOMIZE / "overlays" / overlay
    for patch in yaml.safe_load((root / "kustomization.yaml").read_text()).get("patches", []):
        for doc in yaml.safe_load_all((root / patch["path"]).read_text()):
            if doc["kind"] == "Deployment":
                patched = doc["spec"]["template"]["spec"].get("containers", [])
                container = merge(container, next((c for c in patched if c["name"] == container["name"]), {}))
    return container


@pytest.mark.parametrize("overlay,image", [("cpu-demo", "cpu-image"), ("gpu", "gpu-image")],
                         ids=["cpu-demo-overlay", "gpu-overlay"])
def test_liveness_waits_out_the_image_start_period(overlay, image):
    """The kubelet must not restart a server that is still loading: before the liveness probe may
    kill the container, the pod gets at least the start period its image's HEALTHCHECK allows."""
    container = _merged_container(overlay)
    start_period = re.search(r"--start-period=(\d+)s", _one(_commands(image), "HEALTHCHECK").original)
    probe = container.get("startupProbe") or container["livenessProbe"]
    grace = probe.get("initialDelaySeconds", 0) + probe.get("periodSeconds", 10) * probe.get(
        "failureThreshold", 3)
    assert grace >= int(start_period.group(1)), (overlay, probe)


def test_gpu_overlay_build_config_plans():
    config = load_build_config(KUSTOMIZE / "overlays" / "gpu" / "build.yaml")
    assert config.flavour == "trtllm" and config.deployment.weights_dir == "/models"
    check_fits(plan_memory(config.deployment), config.deployment.min_concurrency, "gpu overlay")


def test_cli_parse_check_refuses_what_trtspec_refuses():
    with pytest.raises(click.NoSuchOption):
        parse_trtspec(["trtspec", "serve", "/models/tiny", "--http-prot", "8000"])
    with pytest.raises(click.UsageError):
        parse_trtspec(["trtspec", "srve", "/models/tiny"])
