"""Experiment config: NNI's v2 rules, per-platform sections, v1 conversion, error messages."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import yaml

from trialflow.config import (
    ConfigError,
    load_config,
    parse_config,
    parse_duration,
    parse_gpu_indices,
    parse_size_mb,
)

SPACE = {"lr": {"_type": "loguniform", "_value": [0.0001, 0.1]}}


def minimal(tmp_path: Path, **extra) -> dict:
    cfg = {"searchSpace": SPACE, "trialCommand": "python3 trial.py", "trialCodeDirectory": str(tmp_path),
           "trialConcurrency": 1, "tuner": {"name": "TPE"}, "trainingService": {"platform": "local"}}
    cfg.update(extra)
    return cfg


def problems(data, base_dir=None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(data, base_dir=base_dir)
    return info.value.problems


def test_keys_are_case_and_underscore_insensitive(tmp_path):
    cfg = parse_config({"search_space": SPACE, "TRIAL_COMMAND": "python3 t.py", "trialcodedirectory": str(tmp_path),
                        "_trialConcurrency_": 3, "Tuner": {"NAME": "Random"},
                        "training_service": {"PLATFORM": "local"}})
    assert cfg.trial_concurrency == 3 and cfg.tuner.name == "Random"
    assert cfg.services[0].trial_command == "python3 t.py"  # shortcut copied into the section


@pytest.mark.parametrize("text,seconds", [("1h", 3600), ("30m", 1800), ("2d", 172800), ("10s", 10), (90, 90),
                                          ("1.5h", 5400), ("0.5s", 1), ("2H", 7200)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text,mb", [("8GB", 8192), ("512mb", 512), (100, 100), ("1tb", 1048576), ("1kb", 1),
                                     ("1.5gb", 1536)])
def test_sizes(text, mb):
    assert parse_size_mb(text) == mb


@pytest.mark.parametrize("value,expected", [(1, [1]), ("0,1", [0, 1]), ([2, 3], [2, 3]), ("0, 2", [0, 2])])
def test_gpu_indices(value, expected):
    assert parse_gpu_indices(value) == expected


@pytest.mark.parametrize("field,value,message", [
    ("maxExperimentDuration", "10x", 'maxExperimentDuration: bad duration "10x": supported units are d, h, m, s'),
    ("maxTrialDuration", "-5m", "maxTrialDuration: bad duration"),
    ("maxTrialNumber", 0, "maxTrialNumber: Input should be greater than 0"),
    ("trialConcurrency", 0, "trialConcurrency: Input should be greater than 0"),
    ("trialConcurrency", "many", "trialConcurrency: Input should be a valid integer"),
    ("logLevel", "loud", "logLevel: Input should be 'fatal', 'error', 'warning', 'info', 'debug' or 'trace'"),
    ("tunerGpuIndices", "0,0", "tunerGpuIndices: duplicated GPU indices in [0, 0]"),
    ("tunerGpuIndices", [-1], "tunerGpuIndices: negative GPU index in [-1]"),
    ("trialGpuNumber", -1, "trialGpuNumber: Input should be greater than or equal to 0"),
])
def test_bad_top_level_fields_name_the_field_and_rule(tmp_path, field, value, message):
    found = problems(minimal(tmp_path, **{field: value}))
    assert any(message in p for p in found), found


def test_unknown_key_suggests_closest_name(tmp_path):
    data = minimal(tmp_path)
    data["trialConcurency"] = data.pop("trialConcurrency")
    found = problems(data)
    assert "trialConcurency: unknown field; did you mean 'trialConcurrency'?" in found
    assert "trialConcurrency: is required but not set" in found  # every problem, not just the first


def test_unknown_key_in_nested_section_has_its_path(tmp_path):
    found = problems(minimal(tmp_path, trainingService={"platform": "local", "gpuIndex": 0}))
    assert found == ["trainingService.gpuIndex: unknown field; did you mean 'gpuIndices'?"]


def test_remote_machine_port_error_names_the_list_index(tmp_path):
    key = tmp_path / "id_rsa"
    key.write_text("k")
    machines = [{"host": "127.0.0.1", "user": "a", "sshKeyFile": str(key)},
                {"host": "127.0.0.1", "user": "b", "port": 70000, "sshKeyFile": str(key)}]
    found = problems(minimal(tmp_path, trainingService={"platform": "remote", "machineList": machines}))
    assert any("trainingService.machineList[1].port: Input should be less than 65536 (got 70000)" in p
               for p in found), found


def test_remote_needs_password_or_key(tmp_path):
    machines = [{"host": "h", "user": "u", "sshKeyFile": str(tmp_path / "missing")}]
    found = problems(minimal(tmp_path, trainingService={"platform": "remote", "machineList": machines}))
    assert any("provide a password or a valid SSH key file" in p for p in found), found


def test_secrets_are_never_printed(tmp_path):
    machines = [{"host": "h", "user": "u", "password": "hunter2-secret"}]
    cfg = parse_config(minimal(tmp_path, trainingService={"platform": "remote", "machineList": machines}))
    assert "hunter2-secret" not in repr(cfg) and "hunter2-secret" not in str(cfg.dump())
    assert cfg.services[0].machine_list[0].password.get_secret_value() == "hunter2-secret"
    bad = [{"host": "h", "user": "u", "password": ["hunter2-secret"]}]
    found = problems(minimal(tmp_path, trainingService={"platform": "remote", "machineList": bad}))
    assert found and not any("hunter2" in p for p in found)


def test_unknown_platform_lists_the_allowed_ones(tmp_path):
    found = problems(minimal(tmp_path, trainingService={"platform": "sge"}))
    assert any("platform must be one of local, remote, openpai, aml, dlc, kubeflow" in p for p in found), found


def test_code_directory_must_exist(tmp_path):
    found = problems(minimal(tmp_path, trialCodeDirectory=str(tmp_path / "nope")))
    assert any("is not a directory; set trialCodeDirectory" in p for p in found), found


def test_search_space_exactly_one(tmp_path):
    data = minimal(tmp_path, searchSpaceFile=str(tmp_path / "s.json"))
    (tmp_path / "s.json").write_text("{}")
    assert any("set exactly one of searchSpace or searchSpaceFile" in p for p in problems(data))
    data = minimal(tmp_path)
    del data["searchSpace"]
    assert any("set exactly one of searchSpace or searchSpaceFile" in p for p in problems(data))



def test_an_empty_search_space_is_refused_for_a_built_in_tuner_only(tmp_path):
    """Built-in tuners need a parameter; a customized one may keep its space in its code, as NNI's own
    examples/trials/ga_squad/config.yml says with ``searchSpace: {}  # hard-coded in tuner``."""
    assert problems(minimal(tmp_path, searchSpace={})) == [
        '<top level>: searchSpace is empty: give at least one parameter, e.g. '
        '{"lr": {"_type": "loguniform", "_value": [0.0001, 0.1]}}']
    (tmp_path / "empty.json").write_text("{}")
    data = minimal(tmp_path, searchSpaceFile=str(tmp_path / "empty.json"))
    del data["searchSpace"]
    assert any(f'searchSpaceFile "{tmp_path / "empty.json"}" is empty' in p for p in problems(data))
    (tmp_path / "own_tuner.py").write_text("class Own:\n    pass\n")
    own = parse_config(minimal(tmp_path, searchSpace={}, tuner={"className": "own_tuner.Own",
                                                                "codeDirectory": str(tmp_path)}))
    assert own.search_space == {} and own.custom_tuner


def test_a_placeholder_left_in_nnis_example_is_named_as_one(tmp_path):
    """NNI's examples write ``server: {your_nfs_server_ip}``, which YAML reads as a mapping; left as it
    is, the line says it is a placeholder to fill, not that a mapping is no string."""
    (tmp_path / "search_space.json").write_text(json.dumps(SPACE))
    path = tmp_path / "config_kubeflow.yml"
    path.write_text("""\
trialConcurrency: 1
searchSpaceFile: search_space.json
trialCodeDirectory: .
tuner: {name: TPE}
trainingService:
  platform: kubeflow
  reuseMode: false
  worker: {replicas: 1, command: python3 dist_mnist.py, gpuNumber: 0, cpuNumber: 1, memorySize: 2048,
           dockerImage: msranni/nni:latest}
  operator: pytorch-operator
  apiVersion: v1alpha2
  storage:
    storageType: nfs
    # Your NFS server IP, like 10.10.10.10
    server: {your_nfs_server_ip}
    path: /var/nfs/nni
""")
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    assert info.value.problems == ["trainingService.storage.server: {your_nfs_server_ip} is still a placeholder "
                                   "(YAML reads a word in braces as a mapping): write your value there"]

def test_bad_search_space_is_reported_with_parameter(tmp_path):
    found = problems(minimal(tmp_path, searchSpace={"lr": {"_type": "loguniform", "_value": [0, 1]}}))
    assert any('searchSpace: parameter "lr": loguniform needs low > 0, got 0' in p for p in found), found


def test_local_gpu_rules(tmp_path):
    found = problems(minimal(tmp_path, trialGpuNumber=1))
    assert any("useActiveGpu must be set when trialGpuNumber > 0" in p for p in found), found
    found = problems(minimal(tmp_path, trainingService={"platform": "local", "maxTrialNumberPerGpu": 2}))
    assert any("maxTrialNumberPerGpu does not work without trialGpuNumber" in p for p in found), found


def test_tuner_required_and_advisor_moved(tmp_path):
    data = minimal(tmp_path)
    del data["tuner"]
    assert any("tuner must be set" in p for p in problems(data))
    data["advisor"] = {"name": "TPE"}
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert parse_config(data).tuner.name == "TPE"


def test_relative_paths_resolve_against_the_config_folder(tmp_path, monkeypatch):
    folder = tmp_path / "proj"
    (folder / "src").mkdir(parents=True)
    (folder / "space.yml").write_text("x: {_type: choice, _value: [1, 2]}\n")
    (folder / "config.yml").write_text(yaml.safe_dump({
        "searchSpaceFile": "space.yml", "trialCommand": "python3 t.py", "trialCodeDirectory": "src",
        "trialConcurrency": 1, "tuner": {"name": "Random"}, "trainingService": {"platform": "local"},
        "experimentWorkingDirectory": "~/exps"}))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    cfg = load_config(folder / "config.yml")
    assert cfg.services[0].trial_code_directory == (folder / "src").resolve()
    assert cfg.search_space == {"x": {"_type": "choice", "_value": [1, 2]}}  # YAML search space file
    assert cfg.experiment_working_directory == (tmp_path / "home" / "exps")


def test_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yml")
    (tmp_path / "bad.yml").write_text("a: [1, 2\nb: 3\n")
    with pytest.raises(ConfigError, match="not valid YAML at line"):
        load_config(tmp_path / "bad.yml")
    (tmp_path / "list.yml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(tmp_path / "list.yml")
    data = minimal(tmp_path, searchSpaceFile=str(tmp_path / "ss.json"))
    del data["searchSpace"]
    (tmp_path / "ss.json").write_text("{not: json: [")
    assert any("neither valid JSON" in p for p in problems(data))
    # NNI's test/ut/experiment/assets/ss_tab_comma.json, which NNI cannot read either: where each reader
    # stopped, on one line
    (tmp_path / "ss.json").write_text('{\n\t"pool_type": {\n\t\t"_type": "choice",\n\t"_value": [ "max", "min" ],\n'
                                      '\t},\n}\n')
    assert [p.split(": ", 1)[1] for p in problems(data) if "searchSpaceFile" in p] == [
        f'searchSpaceFile "{tmp_path / "ss.json"}" is neither valid JSON (Expecting property name enclosed in double '
        "quotes at line 5, column 2) nor YAML (found character '\\t' that cannot start any token at line 2, column "
        "1): mend it at one of those places"]


# ---- the example configs of reference §2 ---------------------------------------------------


def _examples(tmp_path: Path) -> dict[str, dict]:
    key = tmp_path / "id_rsa"
    key.write_text("key")
    (tmp_path / "mnt").mkdir(exist_ok=True)
    nfs = {"storageType": "nfs", "server": "10.0.0.1", "path": "/exports/nni"}
    return {
        "local": {"platform": "local", "useActiveGpu": False, "gpuIndices": "0,1", "maxTrialNumberPerGpu": 2},
        "remote": {"platform": "remote", "reuseMode": True, "machineList": [
            {"host": "10.1.1.1", "user": "bob", "sshKeyFile": str(key), "gpuIndices": [0]},
            {"host": "10.1.1.2", "port": 2222, "user": "alice", "password": "pw", "pythonPath": "/opt/py/bin"}]},
        "openpai": {"platform": "openpai", "host": "pai.example.com", "username": "u", "token": "t",
                    "trialCpuNumber": 2, "trialMemorySize": "8GB", "storageConfigName": "confignfs",
                    "localStorageMountPoint": str(tmp_path / "mnt"), "containerStorageMountPoint": "/mnt/confignfs",
                    "virtualCluster": "default"},
        "kubeflow": {"platform": "kubeflow", "operator": "tf-operator", "apiVersion": "v1", "storage": nfs,
                     "worker": {"replicas": 2, "command": "python3 trial.py", "gpuNumber": 0, "cpuNumber": 1,
                                "memorySize": "2gb", "dockerImage": "msranni/nni"},
                     "ps": {"replicas": 1, "command": "python3 ps.py", "cpuNumber": 1, "memorySize": 1024}},
        "frameworkcontroller": {"platform": "frameworkcontroller", "storage": nfs,
                                "serviceAccountName": "frameworkbarrier",
                                "taskRoles": [{"name": "worker", "taskNumber": 1, "command": "python3 t.py",
                                               "gpuNumber": 0, "cpuNumber": 1, "memorySize": "4gb",
                                               "frameworkAttemptCompletionPolicy": {"minFailedTaskCount": 1,
                                                                                    "minSucceedTaskCount": 1}}]},
        "dlc": {"platform": "dlc", "type": "Worker", "image": "registry/pai-dlc/tf:1.15", "jobType": "TFJob",
                "podCount": 1, "ecsSpec": "ecs.c6.large", "region": "cn-hangzhou", "workspaceId": "None",
                "nasDataSourceId": "ds1", "accessKeyId": "id", "accessKeySecret": "dlc-s3cr3t-value",
                "localStorageMountPoint": "/home/admin/workspace/", "containerStorageMountPoint": "/root/data/"},
        "aml": {"platform": "aml", "subscriptionId": "sub", "resourceGroup": "rg", "workspaceName": "ws",
                "computeTarget": "gpu-cluster"},
    }


@pytest.mark.parametrize("platform", ["local", "remote", "openpai", "kubeflow", "frameworkcontroller", "dlc", "aml"])
def test_example_configs_load(tmp_path, platform):
    section = _examples(tmp_path)[platform]
    extra = {"trialGpuNumber": 1} if platform in ("local", "openpai") else {}
    cfg = parse_config(minimal(tmp_path, trainingService=section, **extra))
    assert cfg.services[0].platform == platform
    assert cfg.services[0].trial_command == "python3 trial.py"


def test_example_values_are_canonical(tmp_path):
    ex = _examples(tmp_path)
    pai = parse_config(minimal(tmp_path, trainingService=ex["openpai"], trialGpuNumber=0)).services[0]
    assert pai.host == "https://pai.example.com" and pai.trial_memory_size == 8192
    kf = parse_config(minimal(tmp_path, trainingService=ex["kubeflow"])).services[0]
    assert kf.worker.memory_size == 2048 and kf.storage.storage_type == "nfs" and kf.reuse_mode is True
    dlc = parse_config(minimal(tmp_path, trainingService=ex["dlc"])).services[0]
    assert dlc.workspace_id is None and "dlc-s3cr3t-value" not in str(dlc)


COMMON_KEYS = ["platform", "trialCommand", "trialCodeDirectory", "debug", "reuseMode", "weight", "maxInterruptions"]


def test_sections_on_shared_bases_keep_the_key_order_stored_configs_have(tmp_path):
    """A stored config's sections list their keys as they always did, although their SSH-login and
    Kubernetes fields now come from shared bases (which pydantic would list first)."""
    ex = _examples(tmp_path)
    remote = parse_config(minimal(tmp_path, trainingService=ex["remote"])).dump()["trainingService"]
    assert list(remote) == [*COMMON_KEYS, "machineList", "trustUnknownHosts", "knownHostsFile"]
    assert list(remote["machineList"][0]) == ["host", "port", "user", "sshKeyFile", "useActiveGpu",
                                              "maxTrialNumberPerGpu", "gpuIndices", "remoteWorkingDirectory"]
    slurm = parse_config(minimal(tmp_path, trainingService={
        "platform": "slurm", "host": "login1", "user": "u", "password": "p", "partition": "gpu",
        "loginCommand": "module load slurm"})).dump()["trainingService"]
    assert list(slurm) == [*COMMON_KEYS, "host", "port", "user", "password", "trustUnknownHosts", "knownHostsFile",
                           "remoteWorkingDirectory", "loginCommand", "partition", "cpusPerTrial", "sbatchOptions"]
    kubeflow = parse_config(minimal(tmp_path, trainingService=ex["kubeflow"])).dump()["trainingService"]
    assert list(kubeflow) == [*COMMON_KEYS, "operator", "apiVersion", "storage", "worker", "ps", "namespace",
                              "metricChannel"]
    # the config schema lists them so too
    from trialflow.config import ExperimentConfig

    keys = list(ExperimentConfig.model_json_schema()["$defs"]["SlurmConfig"]["properties"])
    assert keys[keys.index("credentials"):keys.index("loginCommand")] == [
        "credentials", "trustUnknownHosts", "knownHostsFile", "pythonPath", "remoteWorkingDirectory"]


def test_hybrid_list_with_per_service_overrides(tmp_path):
    ex = _examples(tmp_path)
    remote = dict(ex["remote"], trialCommand="python3 remote_trial.py")
    cfg = parse_config(minimal(tmp_path, trainingService=[{"platform": "local"}, remote]))
    assert cfg.is_hybrid
    assert [s.trial_command for s in cfg.services] == ["python3 trial.py", "python3 remote_trial.py"]


def test_kubeflow_role_rules(tmp_path):
    ex = _examples(tmp_path)["kubeflow"]
    bad = dict(ex, operator="pytorch-operator", master={"replicas": 2, "command": "c", "cpuNumber": 1,
                                                        "memorySize": 10})
    bad.pop("ps")
    assert any("exactly one master" in p for p in problems(minimal(tmp_path, trainingService=bad)))
    assert any("storageType must be" in p for p in problems(
        minimal(tmp_path, trainingService=dict(ex, storage={"storageType": "s3"}))))
    assert any("operator" in p for p in problems(minimal(tmp_path, trainingService=dict(ex, operator="mx"))))


V1 = """
authorName: default
experimentName: example_mnist
trialConcurrency: 2
maxExecDuration: 1h
maxTrialNum: 10
trainingServicePlatform: {platform}
searchSpacePath: search_space.json
useAnnotation: false
tuner:
  builtinTunerName: TPE
  classArgs:
    optimize_mode: maximize
assessor:
  builtinAssessorName: Medianstop
trial:
  command: python3 mnist.py
  codeDir: .
  gpuNum: 0
"""


def test_v1_local_config_converts_with_notice(tmp_path):
    (tmp_path / "search_space.json").write_text('{"lr": {"_type": "uniform", "_value": [0.1, 1]}}')
    (tmp_path / "config.yml").write_text(V1.format(platform="local") + "localConfig:\n  gpuIndices: 0\n")
    with pytest.warns(UserWarning, match="legacy v1"):
        cfg = load_config(tmp_path / "config.yml")
    assert cfg.max_experiment_duration == 3600 and cfg.max_trial_number == 10
    assert cfg.tuner.name == "TPE" and cfg.assessor.name == "Medianstop"
    assert cfg.services[0].trial_command == "python3 mnist.py" and cfg.services[0].gpu_indices == [0]


def test_v1_remote_config_converts_machine_list(tmp_path):
    (tmp_path / "search_space.json").write_text('{"lr": {"_type": "uniform", "_value": [0.1, 1]}}')
    text = V1.format(platform="remote") + ("machineList:\n  - ip: 10.0.0.5\n    port: 2200\n    username: bob\n"
                                            "    passwd: pw\n")
    (tmp_path / "config.yml").write_text(text)
    with pytest.warns(UserWarning):
        cfg = load_config(tmp_path / "config.yml")
    machine = cfg.services[0].machine_list[0]
    assert (machine.host, machine.port, machine.user) == ("10.0.0.5", 2200, "bob")


def test_v1_hybrid_config_converts_to_the_list_of_its_platforms(tmp_path):
    """NNI 2's v1 hybrid file (its mnist-tfv1/config_hybrid.yml): ``hybridConfig`` names the platforms,
    each built from its own v1 section, in v2's list (NNI's own converter left these files out)."""
    (tmp_path / "search_space.json").write_text('{"lr": {"_type": "uniform", "_value": [0.1, 1]}}')
    text = V1.format(platform="hybrid") + ("hybridConfig:\n  trainingServicePlatforms:\n    - local\n    - remote\n"
                                            "remoteConfig:\n  reuse: true\nmachineList:\n  - ip: 10.1.1.1\n"
                                            "    username: xxx\n    passwd: xxx\n    port: 22\n")
    (tmp_path / "config.yml").write_text(text)
    with pytest.warns(UserWarning, match="legacy v1"):
        cfg = load_config(tmp_path / "config.yml")
    assert cfg.is_hybrid and [s.platform for s in cfg.services] == ["local", "remote"]
    remote = cfg.services[1]
    assert remote.reuse_mode and (remote.machine_list[0].host, remote.machine_list[0].user) == ("10.1.1.1", "xxx")
    assert [s.trial_command for s in cfg.services] == ["python3 mnist.py"] * 2
    (tmp_path / "config.yml").write_text(text.replace(":\n    - local\n    - remote\n", ": remote\n"))
    with pytest.warns(UserWarning, match="legacy v1"):
        one = load_config(tmp_path / "config.yml")  # one platform named without a list
    assert [s.platform for s in one.services] == ["remote"]


def test_trialflow_home_is_where_new_experiments_go(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIALFLOW_HOME", str(tmp_path / "home"))
    raw = {"searchSpace": {"x": {"_type": "choice", "_value": [1]}}, "trialCommand": "true", "trialConcurrency": 1,
           "trialCodeDirectory": str(tmp_path), "tuner": {"name": "TPE"}, "trainingService": {"platform": "local"}}
    assert Path(parse_config(raw).experiment_working_directory) == tmp_path / "home"
    monkeypatch.delenv("TRIALFLOW_HOME")
    config = parse_config(raw)
    assert Path(config.experiment_working_directory) == Path("~/trialflow-experiments").expanduser()


@pytest.mark.parametrize("kind", ["tfjob", "framework"])
def test_kubeflow_and_frameworkcontroller_need_no_trial_command_unless_reuse(tmp_path, kind):
    from tests.conftest import k8s_section

    data = minimal(tmp_path, trainingService=k8s_section(kind, tmp_path, reuse=False))
    del data["trialCommand"]
    assert parse_config(data).services[0].trial_command == ""
    data["trainingService"]["reuseMode"] = True
    assert any("trialCommand is required with reuseMode: true" in p for p in problems(data))
    local = minimal(tmp_path)
    del local["trialCommand"]
    assert any("trialCommand is required" in p for p in problems(local))


def test_nnis_role_only_kubernetes_configs_run_without_reuse(tmp_path):
    """NNI's documented FrameworkController example (v2: task roles, no trialCommand, no reuseMode) and its
    v1 examples/trials/mnist-pytorch/config_kubeflow.yml load, each trial running the roles' commands."""
    from tests.conftest import k8s_section

    section = k8s_section("framework", tmp_path)
    del section["reuseMode"]
    data = minimal(tmp_path, trainingService=section)
    del data["trialCommand"]
    with pytest.warns(UserWarning, match="no trialCommand: each trial runs the roles' commands in a job of its own"):
        service = parse_config(data).services[0]
    assert service.reuse_mode is False and service.task_roles[0].command == 'python3 "$NNI_TRIAL_JOB_ID.py"'
    (tmp_path / "search_space.json").write_text(json.dumps(SPACE))
    v1 = {"authorName": "default", "experimentName": "example_dist_pytorch", "trialConcurrency": 1,
          "maxExecDuration": "1h", "maxTrialNum": 1, "trainingServicePlatform": "kubeflow",
          "searchSpacePath": "search_space.json", "useAnnotation": False,
          "tuner": {"builtinTunerName": "TPE", "classArgs": {"optimize_mode": "maximize"}},
          "trial": {"codeDir": ".", "worker": {"replicas": 1, "command": "python3 mnist.py", "gpuNum": 0,
                                               "cpuNum": 1, "memoryMB": 8192, "image": "msranni/nni:latest"}},
          "kubeflowConfig": {"operator": "tf-operator", "apiVersion": "v1alpha2", "storage": "nfs",
                             "nfs": {"server": "10.10.10.10", "path": "/var/nfs/general"}}}
    (tmp_path / "config_kubeflow.yml").write_text(yaml.safe_dump(v1))
    with pytest.warns(UserWarning, match="legacy v1"):
        kubeflow = load_config(tmp_path / "config_kubeflow.yml").services[0]
    assert (kubeflow.reuse_mode, kubeflow.trial_command, kubeflow.worker.command) == (False, "", "python3 mnist.py")


def test_v1_aml_config_converts_as_nnis_converter_does(tmp_path):
    """NNI's examples/trials/mnist-tfv1/config_aml.yml shape: amlConfig and trial.image move to the section."""
    v1 = {"authorName": "default", "experimentName": "example_mnist", "trialConcurrency": 1, "maxTrialNum": 10,
          "trainingServicePlatform": "aml", "searchSpace": SPACE, "useAnnotation": False,
          "tuner": {"builtinTunerName": "TPE", "classArgs": {"optimize_mode": "maximize"}},
          "trial": {"command": "python3 mnist.py", "codeDir": str(tmp_path), "image": "msranni/nni"},
          "amlConfig": {"subscriptionId": "${replace_to_your_subscriptionId}", "resourceGroup": "rg",
                        "workspaceName": "ws", "computeTarget": "gpu-cluster"}}
    with pytest.warns(UserWarning, match="legacy v1"):
        aml = parse_config(v1).services[0]
    assert (aml.platform, aml.subscription_id, aml.resource_group, aml.workspace_name, aml.compute_target,
            aml.docker_image) == ("aml", "${replace_to_your_subscriptionId}", "rg", "ws", "gpu-cluster", "msranni/nni")


def test_numbers_in_string_fields_as_in_nnis_examples(tmp_path):
    data = minimal(tmp_path, trainingService={"platform": "remote", "machineList": [
        {"host": "127.0.0.1", "port": 22, "user": 1000, "password": 12345}]})
    machine = parse_config(data).services[0].machine_list[0]
    assert machine.user == "1000" and machine.password.get_secret_value() == "12345"
    assert "12345" not in repr(machine) and "12345" not in str(parse_config(data).dump())


@pytest.mark.parametrize(("section", "given", "closest"), [
    ("tuner", "TPEE", "tpe"), ("tuner", "MetisTunr", "metis"), ("tuner", "NoSuchTuner", None),
    ("tuner", "MyTuner", None), ("assessor", "MedianStopp", "medianstop")])
def test_unknown_tuner_or_assessor_is_refused_at_load(tmp_path, section, given, closest):
    """A near spelling is suggested; a name near none of them (but for the kind's suffix) gets no guess."""
    [problem] = problems(minimal(tmp_path, **{section: {"name": given}}))
    assert f"{section}.name: unknown {section} {given!r}" in problem
    if closest:
        assert f"did you mean {closest!r}" in problem
    else:
        assert "did you mean" not in problem, problem


def test_a_bad_platform_is_named_in_the_message(tmp_path):
    [problem] = problems(minimal(tmp_path, trainingService={"platform": "kubeflw"}))
    assert "got 'kubeflw'" in problem and "kubeflow" in problem


def test_a_json_config_named_yml_keeps_its_exponent_numbers(tmp_path):
    """JSON (and Python's json.dumps) write 1e-06 without a dot, which YAML 1.1 reads as a string: a
    config file written that way is read with the numbers it states, as YAML 1.2 would."""
    path = tmp_path / "config.yml"
    path.write_text(json.dumps(minimal(tmp_path, searchSpace={"alpha": {"_type": "loguniform",
                                                                        "_value": [1e-06, 1e-2]}})))
    assert '"_value": [1e-06, 0.01]' in path.read_text()
    config = load_config(path)
    assert config.search_space["alpha"]["_value"] == [1e-06, 0.01]
    path.write_text("experimentName: '1e5'\n" + yaml.safe_dump(minimal(tmp_path)))  # quoted, it stays text
    assert load_config(path).experiment_name == "1e5"
