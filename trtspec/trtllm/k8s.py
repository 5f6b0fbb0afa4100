"""Kubernetes manifests: one replica per node group.

- one node per replica: a Deployment (`replicas` pods, each with `gpus_per_node` GPUs) + Service;
- several nodes per replica: a LeaderWorkerSet (sigs.k8s.io/lws, `leaderworkerset.x-k8s.io/v1`)
  whose group size is `nodes`. Workers run sshd; the leader writes an MPI hostfile from LWS's
  `LWS_LEADER_ADDRESS` / `LWS_GROUP_SIZE` (worker pods are named `<leader>-<index>` in the same
  subdomain) and starts `mpirun ... trtllm-llmapi-launch trtllm-serve`.

Manifests expect two objects the operator creates: a PersistentVolumeClaim `<name>-weights`
holding the checkpoints (mounted read-only at `weights_dir`) and, multi-node only, a Secret
`<name>-ssh` (mounted read-only at /root/.ssh) holding a passwordless key pair for root: the private
key as `id_ed25519` and its public key as `authorized_keys` (README says how to make it).

Each worker pod generates its own sshd host keys when it starts (`ssh-keygen -A`: an image
need not ship any, and sshd exits without one), so they cannot be known in advance: the leader's
mpirun connects without a known_hosts file (`StrictHostKeyChecking=no`, as Kubeflow's MPI
operator does), which a read-only /root/.ssh could not record anyway.
"""

from __future__ import annotations

import shlex

import yaml

from trtspec.config import BuildConfig
from trtspec.trtllm.launch import SERVE_CONFIG, mpirun_prefix, serve_command

CONFIG_MOUNT = "/etc/trtspec"
# the ssh options mpirun's launcher passes (Open MPI reads OMPI_MCA_plm_rsh_args from the environment)
MPI_SSH_ARGS = "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"


def _volumes(name: str, ssh: bool) -> list[dict]:
    vols = [
        {"name": "serve-config", "configMap": {"name": f"{name}-serve-config"}},
        {"name": "weights", "persistentVolumeClaim": {"claimName": f"{name}-weights", "readOnly": True}},
        {"name": "shm", "emptyDir": {"medium": "Memory"}},
    ]
    if ssh:
        vols.append({"name": "ssh", "secret": {"secretName": f"{name}-ssh", "defaultMode": 0o400}})
    return vols


def _mounts(config: BuildConfig, ssh: bool) -> list[dict]:
    mounts = [
        {"name": "serve-config", "mountPath": CONFIG_MOUNT},
        {"name": "weights", "mountPath": config.deployment.weights_dir, "readOnly": True},
        {"name": "shm", "mountPath": "/dev/shm"},
    ]
    if ssh:
        mounts.append({"name": "ssh", "mountPath": "/root/.ssh"})
    return mounts


def _container(config: BuildConfig, command: list[str], ssh: bool, probe: bool) -> dict:
    dep = config.deployment
    container = {
        "name": "trtllm",
        "image": dep.image,
        "command": command,
        "ports": [{"containerPort": dep.port, "name": "http"}],
        "resources": {"limits": {"nvidia.com/gpu": dep.gpus_per_node}},
        "volumeMounts": _mounts(config, ssh),
    }
    if probe:
        container["readinessProbe"] = {
            "httpGet": {"path": "/health", "port": "http"},
            "initialDelaySeconds": 60,
            "periodSeconds": 10,
        }
    return container


def _config_map(config: BuildConfig, serve_yaml: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{config.name}-serve-config"},
        "data": {SERVE_CONFIG: serve_yaml},
    }


def _service(config: BuildConfig, selector: dict) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": config.name},
        "spec": {
            "selector": selector,
            "ports": [{"name": "http", "port": config.deployment.port, "targetPort": "http"}],
        },
    }


def _hostfile_then(config: BuildConfig, command: list[str]) -> str:
    slots = config.deployment.gpus_per_node
    return "\n".join(
        [
            "set -euo pipefail",
            'BASE="${LWS_LEADER_ADDRESS%%.*}"; DOMAIN="${LWS_LEADER_ADDRESS#*.}"',
            f'{{ echo "$LWS_LEADER_ADDRESS slots={slots}"; for i in $(seq 1 $((LWS_GROUP_SIZE - 1))); do',
            f'  echo "$BASE-$i.$DOMAIN slots={slots}"; done; }} > /tmp/hostfile',
            "exec " + shlex.join(command),
        ]
    )


def manifests(config: BuildConfig, serve_yaml: str) -> list[dict]:
    """Kubernetes objects for `config` (ConfigMap, workload, Service)."""
    dep, name = config.deployment, config.name
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/managed-by": "trtspec"}
    serve = serve_command(config, f"{CONFIG_MOUNT}/{SERVE_CONFIG}")
    if dep.nodes == 1:
        workload = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "replicas": dep.replicas,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "containers": [_container(config, serve, False, True)],
                        "volumes": _volumes(name, False),
                    },
                },
            },
        }
        return [_config_map(config, serve_yaml), workload, _service(config, labels)]
    leader_cmd = ["bash", "-c", _hostfile_then(config, mpirun_prefix(config, "/tmp/hostfile") + serve)]
    worker_cmd = ["bash", "-c", "mkdir -p /run/sshd && ssh-keygen -A && exec /usr/sbin/sshd -D"]
    leader = _container(config, leader_cmd, True, True)
    leader["env"] = [{"name": "OMPI_MCA_plm_rsh_args", "value": MPI_SSH_ARGS}]
    pod = {"metadata": {"labels": labels}}
    workload = {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": dep.replicas,
            "leaderWorkerTemplate": {
                "size": dep.nodes,
                "leaderTemplate": {
                    **pod,
                    "spec": {
                        "containers": [leader],
                        "volumes": _volumes(name, True),
                    },
                },
                "workerTemplate": {
                    **pod,
                    "spec": {
                        "containers": [_container(config, worker_cmd, True, False)],
                        "volumes": _volumes(name, True),
                    },
                },
            },
        },
    }
    leader_only = {**labels, "leaderworkerset.sigs.k8s.io/worker-index": "0"}
    return [_config_map(config, serve_yaml), workload, _service(config, leader_only)]


class _NoAliases(yaml.SafeDumper):
    """Manifests repeat label mappings; write them out instead of as YAML anchors."""

    def ignore_aliases(self, data) -> bool:
        return True


def dump_manifests(objects: list[dict]) -> str:
    return yaml.dump_all(objects, Dumper=_NoAliases, sort_keys=False, default_flow_style=False)
