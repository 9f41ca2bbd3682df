"""Generated tool sets the size of real ones, for the SDK budget tests and the manual's table (docs/tools.rst).

``api_tools(n)`` is the first ``n`` of 2,500 tools shaped like an aggregated
MCP server: 25 services, 10 resources each, 10 operations on each resource,
named ``<service>__<operation>_<resource>`` with a description and argument
schemas as an API generator writes them. ``python tests/toolsets.py`` prints
the manual's table (description size at the default budget against the same
tools as native JSON tool definitions).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from nous_sched import Tool, run_code_tool, sdk

SERVICES: dict[str, tuple[str, ...]] = {
    "github": (
        "issue",
        "pull_request",
        "repository",
        "branch",
        "commit",
        "release",
        "workflow",
        "gist",
        "label",
        "milestone",
    ),
    "slack": ("channel", "message", "user", "reaction", "file", "reminder", "bookmark", "usergroup", "emoji", "pin"),
    "jira": (
        "issue",
        "project",
        "sprint",
        "board",
        "comment",
        "worklog",
        "version",
        "component",
        "filter",
        "attachment",
    ),
    "stripe": (
        "charge",
        "refund",
        "customer",
        "invoice",
        "subscription",
        "payout",
        "dispute",
        "coupon",
        "price",
        "product",
    ),
    "shopify": (
        "order",
        "product",
        "collection",
        "customer",
        "fulfillment",
        "inventory_item",
        "discount",
        "theme",
        "location",
        "draft_order",
    ),
    "notion": ("page", "database", "block", "comment", "user", "property", "template", "workspace", "view", "relation"),
    "linear": (
        "issue",
        "project",
        "cycle",
        "team",
        "label",
        "comment",
        "roadmap",
        "initiative",
        "document",
        "attachment",
    ),
    "zendesk": (
        "ticket",
        "user",
        "organization",
        "macro",
        "view",
        "trigger",
        "article",
        "group",
        "brand",
        "satisfaction_rating",
    ),
    "hubspot": (
        "contact",
        "company",
        "deal",
        "ticket",
        "note",
        "task",
        "meeting",
        "pipeline",
        "owner",
        "email_campaign",
    ),
    "salesforce": (
        "account",
        "lead",
        "opportunity",
        "case",
        "contact",
        "campaign",
        "quote",
        "contract",
        "report",
        "dashboard",
    ),
    "gmail": (
        "message",
        "thread",
        "draft",
        "label",
        "filter",
        "attachment",
        "alias",
        "forwarding_address",
        "delegate",
        "history",
    ),
    "calendar": (
        "event",
        "calendar",
        "attendee",
        "reminder",
        "acl_rule",
        "free_busy",
        "color",
        "setting",
        "room",
        "recurrence",
    ),
    "drive": (
        "file",
        "folder",
        "permission",
        "revision",
        "comment",
        "shared_drive",
        "shortcut",
        "label",
        "reply",
        "change",
    ),
    "dropbox": (
        "file",
        "folder",
        "shared_link",
        "member",
        "team_folder",
        "paper_doc",
        "file_request",
        "tag",
        "lock",
        "revision",
    ),
    "twilio": (
        "sms",
        "call",
        "phone_number",
        "recording",
        "conference",
        "queue",
        "conversation",
        "verification",
        "fax",
        "transcription",
    ),
    "sendgrid": (
        "email",
        "template",
        "contact_list",
        "sender",
        "suppression",
        "segment",
        "domain",
        "api_key",
        "webhook",
        "stat",
    ),
    "datadog": (
        "monitor",
        "dashboard",
        "metric",
        "event",
        "incident",
        "slo",
        "synthetic_test",
        "log_index",
        "notebook",
        "downtime",
    ),
    "pagerduty": (
        "incident",
        "service",
        "schedule",
        "escalation_policy",
        "oncall",
        "team",
        "alert",
        "maintenance_window",
        "priority",
        "response_play",
    ),
    "sentry": (
        "issue",
        "event",
        "project",
        "release",
        "alert_rule",
        "team",
        "organization",
        "replay",
        "monitor",
        "integration",
    ),
    "cloudflare": (
        "zone",
        "dns_record",
        "firewall_rule",
        "worker",
        "page_rule",
        "certificate",
        "load_balancer",
        "kv_namespace",
        "r2_bucket",
        "tunnel",
    ),
    "aws": (
        "instance",
        "bucket",
        "lambda_function",
        "security_group",
        "volume",
        "snapshot",
        "queue",
        "topic",
        "role",
        "stack",
    ),
    "asana": ("task", "project", "section", "portfolio", "goal", "tag", "story", "workspace", "team", "custom_field"),
    "trello": ("board", "card", "list", "checklist", "member", "label", "action", "attachment", "webhook", "power_up"),
    "intercom": ("conversation", "contact", "company", "article", "segment", "tag", "note", "admin", "team", "ticket"),
    "airtable": (
        "base",
        "table",
        "record",
        "field",
        "view",
        "comment",
        "webhook",
        "automation",
        "interface",
        "collaborator",
    ),
}
OPERATIONS: dict[str, str] = {
    "list": "List the {things} in {Service}, newest first, one page at a time.",
    "get": "Get one {thing} from {Service} by its id, with every field.",
    "create": "Create a new {thing} in {Service} from the given fields.",
    "update": "Update the given fields of an existing {thing} in {Service}.",
    "delete": "Delete a {thing} from {Service}. This cannot be undone.",
    "search": "Search the {things} in {Service} by words in their text and fields.",
    "archive": "Archive a {thing} in {Service}: hidden from lists, kept for restore.",
    "restore": "Restore an archived {thing} in {Service}.",
    "export": "Export {things} from {Service} as CSV or JSON for a date range.",
    "count": "Count the {things} in {Service} that match a filter.",
}


def _schema(operation: str, thing: str) -> dict[str, Any]:
    id_arg = {f"{thing}_id": {"type": "string", "description": f"The id of the {thing.replace('_', ' ')}."}}
    page = {
        "limit": {"type": "integer", "description": "How many to return (1-100).", "default": 25},
        "cursor": {"type": "string", "description": "The cursor of the next page, from the previous response."},
    }
    fields = {
        "fields": {
            "type": "object",
            "description": f"The {thing.replace('_', ' ')}'s fields to set.",
            "additionalProperties": True,
        }
    }
    shapes: dict[str, tuple[dict[str, Any], list[str]]] = {
        "list": (page, []),
        "get": (id_arg, [f"{thing}_id"]),
        "create": (fields, ["fields"]),
        "update": ({**id_arg, **fields}, [f"{thing}_id", "fields"]),
        "delete": (id_arg, [f"{thing}_id"]),
        "search": ({"query": {"type": "string", "description": "Words to look for."}, **page}, ["query"]),
        "archive": (id_arg, [f"{thing}_id"]),
        "restore": (id_arg, [f"{thing}_id"]),
        "export": (
            {
                "since": {"type": "string", "format": "date", "description": "First day, inclusive."},
                "until": {"type": "string", "format": "date", "description": "Last day, inclusive."},
                "format": {"enum": ["csv", "json"], "default": "json"},
            },
            ["since", "until"],
        ),
        "count": (
            {"filter": {"type": "object", "description": "Field values to match.", "additionalProperties": True}},
            [],
        ),
    }
    properties, required = shapes[operation]
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def api_tools(n: int, function: Any = None) -> list[Tool]:
    """The first ``n`` (at most 2,500) generated tools; each calls ``function(name, args)`` if given."""
    tools: list[Tool] = []
    for service, things in SERVICES.items():
        for thing in things:
            for operation, text in OPERATIONS.items():
                if len(tools) == n:
                    return tools
                name = (
                    f"{service}__{operation}_{thing}{'s' if operation in ('list', 'search', 'export', 'count') else ''}"
                )
                words = thing.replace("_", " ")
                description = text.format(thing=words, things=words + "s", Service=service.capitalize())

                def call(args: Any, name: str = name) -> Any:
                    return function(name, args) if function is not None else {"tool": name}

                tools.append(Tool(name, call, description=description, parameters=_schema(operation, thing)))
    assert len(tools) == n, f"only {len(tools)} generated tools"
    return tools


def native_size(tools: list[Tool]) -> int:
    """Characters of ``tools`` as native JSON tool definitions (name, description, input schema)."""
    return len(
        json.dumps([{"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools])
    )


def size_table() -> str:
    """The manual's table (docs/tools.rst), as reStructuredText."""
    rows = [("Tools", "run_code description", "SDK step", "Native JSON tool definitions")]
    for n in (10, 100, 1_000, 2_500):
        tools = api_tools(n)
        description = run_code_tool(tools).description
        rows.append((f"{n:,}", f"{len(description):,}", sdk.step_of(description) or "?", f"{native_size(tools):,}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    rule = "  ".join("=" * width for width in widths)
    lines = [rule, "  ".join(cell.ljust(width) for cell, width in zip(rows[0], widths)).rstrip(), rule]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows[1:]]
    return "\n".join([*lines, rule])


if __name__ == "__main__":
    sys.stdout.write(size_table() + "\n")
