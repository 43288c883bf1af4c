"""A live page for a swarm: `swarm up --dashboard`, `swarm node --dashboard` and `swarm dashboard --run DIR`
serve one page on 127.0.0.1 that reads what a run already writes (run.json, the peers' status.json and
metrics.jsonl, report.json) plus the chain's events, pushed to the browser as server-sent events."""
