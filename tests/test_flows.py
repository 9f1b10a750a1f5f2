"""The plan stage as Prefect objects, against a real (test) Prefect server on loopback."""

from prefect.artifacts import Artifact

from flows.plan import PlanRequest, plan, plan_resources
from tasks.jobspec import JobSpec


def test_plan_flow_returns_ranked_plans_and_an_artifact(prefect_server):
    req = PlanRequest(job=JobSpec(model={"preset": "gpt2-350m"}), cluster="phoebe", top=5)
    plans = plan(req)
    assert len(plans) == 5 and plans[0].rank == 1
    art = Artifact.get("frenzy-plans")
    assert art is not None and "gpt2-350m" in str(art.data)


def test_plan_task_is_pure_logic_without_a_server():
    plans = plan_resources.fn(PlanRequest(job=JobSpec(model={"preset": "gpt2-124m"}), top=2))
    assert [p.rank for p in plans] == [1, 2]


def test_plan_form_schema_has_typed_fields():
    schema = PlanRequest.model_json_schema()
    assert schema["properties"]["rank_by"]["enum"] == ["gpu_seconds", "time", "balanced", "compute"]
    assert "description" in schema["properties"]["cluster"]


def test_every_deployment_entrypoint_loads_and_its_parameters_validate():
    import yaml
    from prefect.flows import load_flow_from_entrypoint

    spec = yaml.safe_load(open("deployments/prefect.yaml"))
    names = set()
    for dep in spec["deployments"]:
        fl = load_flow_from_entrypoint(dep["entrypoint"])
        # the same validation a deployment run performs: the UI form's defaults must be a valid request
        fl.validate_parameters(dep.get("parameters", {}))
        names.add(dep["name"])
        for trig in dep.get("triggers", []):
            from prefect.events.schemas.deployment_triggers import DeploymentEventTrigger

            from flows.train import CHECKPOINT_EVENT

            t = DeploymentEventTrigger.model_validate(trig)
            assert t.expect == {CHECKPOINT_EVENT}  # the event the trainer emits
            payload = {"uri": "file:///x/ckpt/step_00000010", "suite": "quick"}
            rendered = {k: {kk: vv.replace("{{ event.payload.uri }}", payload["uri"])
                            .replace("{{ event.payload.suite }}", payload["suite"]) if isinstance(vv, str) else vv
                            for kk, vv in v.items()}
                        for k, v in trig["parameters"].items()}
            # a step already scored (in-flow, or by an earlier trigger) is not evaluated again
            assert fl.validate_parameters(rendered)["request"].reevaluate is False
    assert {"submit", "plan", "simulate", "train", "stragglers", "evaluate-on-checkpoint", "evaluate-pending"} <= names
