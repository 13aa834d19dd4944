"""A Prefect automation that notifies when a sweep fails or finds a new best trial.

    python examples/automations/notify_sweep.py --block slack-webhook/team-alerts --tag name:nightly-sweep

It matches trialflow's own events of every run tagged ``--tag`` (a run is tagged ``name:<experimentName>``,
its experiment id, platform and tuner, and ``trialflow``; a deployment's runs also carry the deployment's
tags): ``trialflow.experiment.failed`` (an experiment that ended ERROR, or whose trials all failed) and
``trialflow.experiment.best-trial`` (a trial that beat every earlier one of its experiment; the first
successful trial is its experiment's first best). Each sends one message through the notification block
``--block`` (``<block type>/<name>``: a Slack webhook, an email server, a custom webhook, ... saved
beforehand in the Prefect UI's Blocks page or from Python). Run again, it replaces the automation of the same
name. Run it where the Prefect CLI reaches the server the experiments report to (``eval "$(trialflow server
env)"`` for trialflow's own).
"""

from __future__ import annotations

import argparse

from prefect import get_client
from prefect.automations import Automation
from prefect.blocks.core import Block
from prefect.events.actions import SendNotification
from prefect.events.schemas.automations import EventTrigger, Posture

SUBJECT = "{{ event.resource['prefect.resource.name'] }}: {{ event.event }}"
BODY = """{% if event.event == 'trialflow.experiment.best-trial' %}\
experiment {{ event.resource['prefect.resource.name'] }}: new best trial {{ event.payload.trial }} \
(#{{ event.payload.sequence }}), metric {{ event.payload.metric }} (before: {{ event.payload.beaten }}), \
parameters {{ event.payload.parameters }}\
{% else %}\
experiment {{ event.resource['prefect.resource.name'] }} {{ event.payload.status }}: {{ event.payload.message }} \
(trials: {{ event.payload.counts }})\
{% endif %}"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--block", required=True, help="the notification block, as <block type>/<name>")
    parser.add_argument("--tag", default="trialflow", help="the runs it watches (default: every trialflow run)")
    args = parser.parse_args()
    block_id = Block.load(args.block)._block_document_id  # raises ValueError naming a missing block
    name = f"trialflow {args.tag}: failed or new best"
    with get_client(sync_client=True) as client:
        for old in client.read_automations_by_name(name=name):
            client.delete_automation(old.id)
    automation = Automation(
        name=name,
        description=f"a trialflow sweep tagged {args.tag} failed or found a new best trial",
        trigger=EventTrigger(expect={"trialflow.experiment.failed", "trialflow.experiment.best-trial"},
                             match_related={"prefect.resource.role": "tag",
                                            "prefect.resource.id": f"prefect.tag.{args.tag}"},
                             posture=Posture.Reactive, threshold=1, within=0),
        actions=[SendNotification(block_document_id=block_id, subject=SUBJECT, body=BODY)],
    ).create()
    print(f"automation {automation.name!r} ({automation.id}) notifies through {args.block}")


if __name__ == "__main__":
    main()
