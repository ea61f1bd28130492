"""The bench harness: what the scripts in tests/bench/ share, so that each script holds only its
scenarios, its report's content and its command line.

- common: paths, logging, SIGTERM, run metadata, time budget, keeping logs;
- procfs: CPU, RSS and load readings from /proc, and CpuWindow around a run;
- processes: server processes (Broker) and how Mosquitto and our bridge are started;
- rocketmq: RocketMQ started and stopped for a bench, and the ours-rocketmq broker;
- loadgen: the Go load generator (build, one run, a Scenario, idle mode);
- report: plain-text and Markdown tables and their cells.

Modules of one bench's machinery are named after it (versus: run_bench.py's side-by-side runs).
Harness modules import each other only downwards in that list, never a script.
"""
