"""The capacity model's slope, checked by a simulation (docs/deployment.rst, "Scaling out").

A pure discrete-event simulation (no processes, no clocks: a seeded random
stream and a heap of events) of a fleet running programs, fed the per-run
costs ``benchmarks/capacity.py`` measured. Each run:

1. comes in (Poisson arrivals at the offered rate) and, through a Celery
   broker when there is one, takes the broker's time per run (one server:
   Redis is single-threaded);
2. waits for a worker on its machine (``pool`` per machine: a run holds one
   for its whole life), machines taken in turn;
3. uses the machine's CPU for the run and each of its calls (``cores`` per
   machine);
4. makes its ``calls`` one after another: each takes its throttle's place
   in Redis (the Redis server's CPU per throttled call; one server) and then
   the tool's own latency (a pure delay: the tool runs elsewhere);
5. a share of runs suspend for approval: the suspension and its resume take
   Postgres's CPU per pair (``pg_cores`` servers);
6. gives its worker back.

The model (:func:`model`) says the fleet's capacity is the least of: each
machine's workers over a run's life (``machines x pool / life``), its CPU
(``machines x cores / cpu``), Redis (``1 / (calls x redis)``), Postgres
(``pg_cores / (share x pg)``) and the broker (``1 / broker``), and names
the first that binds at each scale. The simulation offers 1.25x that
capacity at each fleet size and measures what comes out: when the model is
right, the measured throughput follows its line (slope: per machine, until
the shared part's ceiling flattens it) and the busiest part is the one it
named.

    python benchmarks/capacity_sim.py [--inputs benchmarks/results/capacity-<commit>.json] [--out FILE]
"""

from __future__ import annotations

import argparse
import collections
import glob
import heapq
import json
import os
import random
from typing import Any, Callable, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: The workload the model is drawn for (documented in the manual beside it).
WORKLOAD = {
    "calls": 10,  # tool calls per run, one after another, each throttled through Redis
    "tool_latency_s": 0.020,  # each tool's own time (an HTTP API, a query): a delay, not this machine's CPU
    "suspend_share": 0.05,  # runs that suspend for approval (one suspension and one resume each)
    "cores": 2,  # per machine: this one's
    "pool": 16,  # worker processes per machine (WorkerPool size)
    "pg_cores": 2,  # the Postgres server's
}


class Station:
    """A first-come-first-served queue with ``servers`` servers."""

    def __init__(self, name: str, servers: int) -> None:
        self.name = name
        self.servers = servers
        self.busy = 0
        self.waiting: collections.deque[tuple[float, Callable[[float], None]]] = collections.deque()
        self.busy_time = 0.0

    def request(self, sim: Sim, service: float, then: Callable[[float], None]) -> None:
        if self.busy < self.servers:
            self._start(sim, service, then)
        else:
            self.waiting.append((service, then))

    def _start(self, sim: Sim, service: float, then: Callable[[float], None]) -> None:
        self.busy += 1
        self.busy_time += service

        def done(now: float) -> None:
            self.busy -= 1
            if self.waiting:
                self._start(sim, *self.waiting.popleft())
            then(now)

        sim.at(sim.now + service, done)


class Pool:
    """Workers held for a run's whole life (acquire, later release)."""

    def __init__(self, size: int) -> None:
        self.free = size
        self.waiting: collections.deque[Callable[[float], None]] = collections.deque()

    def acquire(self, sim: Sim, then: Callable[[float], None]) -> None:
        if self.free > 0:
            self.free -= 1
            then(sim.now)
        else:
            self.waiting.append(then)

    def release(self, sim: Sim) -> None:
        if self.waiting:
            sim.at(sim.now, self.waiting.popleft())
        else:
            self.free += 1


class Sim:
    def __init__(self) -> None:
        self.now = 0.0
        self._events: list[tuple[float, int, Callable[[float], None]]] = []
        self._seq = 0

    def at(self, when: float, action: Callable[[float], None]) -> None:
        self._seq += 1
        heapq.heappush(self._events, (when, self._seq, action))

    def run(self, until: float) -> None:
        while self._events and self._events[0][0] <= until:
            self.now, _, action = heapq.heappop(self._events)
            action(self.now)


def costs_of(inputs: dict[str, Any], broker_ms: Optional[float], celery_cpu_ms: float = 0.0) -> dict[str, float]:
    """Seconds each part spends on one run, from capacity.py's measurement (and, through Celery, the
    broker's Redis time per run and the CPU Celery adds on the machines per run)."""
    worker = next(row for row in inputs["cpu"] if row["runtime"] == "worker")
    calls = WORKLOAD["calls"]
    return {
        "cpu": worker["cpu_ms_per_run"] / 1000 + calls * worker["cpu_us_per_call"] / 1e6 + celery_cpu_ms / 1000,
        "redis_per_call": inputs["redis"]["redis_cpu_us_per_call"] / 1e6,
        "pg_per_pair": inputs["postgres"]["postgres_cpu_ms_per_suspension_and_resume"] / 1000,
        "broker": (broker_ms or 0.0) / 1000,
    }


def model(machines: int, costs: dict[str, float]) -> tuple[float, str, dict[str, float]]:
    """The fleet's capacity in runs per second, the part that binds first, and every part's ceiling."""
    w = WORKLOAD
    life = w["calls"] * (w["tool_latency_s"] + costs["redis_per_call"]) + costs["cpu"] / 1.0
    ceilings = {
        "the tool calls (workers held while tools run)": machines * w["pool"] / life,
        "the machines' CPU": machines * w["cores"] / costs["cpu"],
        "Redis": 1 / (w["calls"] * costs["redis_per_call"]),
        "Postgres": w["pg_cores"] / (w["suspend_share"] * costs["pg_per_pair"]),
    }
    if costs["broker"] > 0:
        ceilings["the broker"] = 1 / costs["broker"]
    first = min(ceilings, key=lambda k: ceilings[k])
    return ceilings[first], first, ceilings


def simulate(machines: int, rate: float, costs: dict[str, float], runs: int, seed: int) -> dict[str, Any]:
    """Offer ``rate`` runs/s to ``machines`` machines for about ``runs`` arrivals; what came out."""
    w = WORKLOAD
    rng = random.Random(seed)
    sim = Sim()
    pools = [Pool(w["pool"]) for _ in range(machines)]
    cpus = [Station("cpu", w["cores"]) for _ in range(machines)]
    redis, postgres, broker = Station("Redis", 1), Station("Postgres", w["pg_cores"]), Station("broker", 1)
    horizon = runs / rate
    # Long enough for every worker of the fleet to fill and the shared parts' backlog to settle
    # before the counting starts (a big fleet's first wave queues in Redis at once).
    life = w["calls"] * (w["tool_latency_s"] + costs["redis_per_call"]) + costs["cpu"]
    fill = 2 * machines * w["pool"] * w["calls"] * costs["redis_per_call"] + 5 * life
    warm = max(horizon * 0.2, fill)
    horizon = max(horizon, warm * 4)
    done: list[float] = []
    turn = iter(range(1 << 62))

    def arrive(now: float) -> None:
        machine = next(turn) % machines
        if costs["broker"] > 0:
            broker.request(sim, rng.expovariate(1 / costs["broker"]), lambda t: start(machine))
        else:
            start(machine)
        sim.at(now + rng.expovariate(rate), arrive)

    def start(machine: int) -> None:
        pools[machine].acquire(sim, lambda t: cpus[machine].request(sim, costs["cpu"], lambda t2: call(machine, 0)))

    def call(machine: int, n: int) -> None:
        if n == w["calls"]:
            finish(machine)
            return
        redis.request(
            sim,
            costs["redis_per_call"],
            lambda t: sim.at(t + rng.expovariate(1 / w["tool_latency_s"]), lambda t2: call(machine, n + 1)),
        )

    def finish(machine: int) -> None:
        def end(now: float) -> None:
            pools[machine].release(sim)
            done.append(now)

        if rng.random() < w["suspend_share"]:
            postgres.request(sim, costs["pg_per_pair"], end)
        else:
            end(sim.now)

    sim.at(0.0, arrive)
    sim.run(horizon)
    counted = [t for t in done if t >= warm]
    span = horizon - warm
    busy = {
        "the machines' CPU": sum(s.busy_time for s in cpus) / (machines * w["cores"] * horizon),
        "Redis": redis.busy_time / horizon,
        "Postgres": postgres.busy_time / (w["pg_cores"] * horizon),
    }
    if costs["broker"] > 0:
        busy["the broker"] = broker.busy_time / horizon
    return {"throughput": len(counted) / span, "utilisation": {k: round(v, 3) for k, v in busy.items()}}


def latest_inputs() -> str:
    found = sorted(glob.glob(os.path.join(ROOT, "benchmarks", "results", "capacity-*.json")), key=os.path.getmtime)
    found = [f for f in found if not f.endswith("-sim.json")]
    if not found:
        raise SystemExit("no benchmarks/results/capacity-*.json: run benchmarks/capacity.py first")
    return found[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--inputs", default="")
    parser.add_argument("--broker-ms", type=float, default=None, help="the broker's time per Celery run (ms)")
    parser.add_argument("--celery-cpu-ms", type=float, default=0.0, help="the CPU Celery adds per run (ms)")
    parser.add_argument("--runs", type=int, default=30000, help="arrivals simulated per point")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    path = args.inputs or latest_inputs()
    with open(path, encoding="utf-8") as f:
        inputs = json.load(f)
    costs = costs_of(inputs, args.broker_ms, args.celery_cpu_ms)
    rows = []
    print(f"inputs: {os.path.relpath(path, ROOT)}; workload: {WORKLOAD}; seconds per run: {costs}")
    print(
        f"{'machines':>8} {'model runs/s':>12} {'simulated':>10} {'ratio':>6}  first bottleneck (model) | busiest (sim)"
    )
    for machines in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        capacity, first, ceilings = model(machines, costs)
        sim = simulate(machines, capacity * 1.25, costs, args.runs, seed=machines)
        below = simulate(machines, capacity * 0.8, costs, args.runs // 2, seed=machines + 1000)
        busiest = max(sim["utilisation"], key=lambda k: sim["utilisation"][k])
        row = {
            "machines": machines,
            "model_capacity": round(capacity, 1),
            "first_bottleneck": first,
            "ceilings": {k: round(v, 1) for k, v in ceilings.items()},
            "simulated_at_1.25x": round(sim["throughput"], 1),
            "ratio": round(sim["throughput"] / capacity, 3),
            "simulated_at_0.8x": round(below["throughput"], 1),
            "offered_at_0.8x": round(capacity * 0.8, 1),
            "utilisation_at_1.25x": sim["utilisation"],
        }
        rows.append(row)
        print(
            f"{machines:>8} {capacity:>12.1f} {sim['throughput']:>10.1f} {row['ratio']:>6.3f}  {first} | "
            f"{busiest if sim['utilisation'][busiest] > 0.9 else 'workers (tools)'} {sim['utilisation']}",
            flush=True,
        )
    out = args.out or path.replace(".json", "-sim.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(
            {"inputs": os.path.relpath(path, ROOT), "workload": WORKLOAD, "costs": costs, "rows": rows}, f, indent=1
        )
        f.write("\n")
    print("written:", os.path.relpath(out, ROOT))


if __name__ == "__main__":
    main()
