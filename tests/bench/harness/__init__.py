"""The bench harness: what the scripts in tests/bench/ share, so that each script holds only its
scenarios, what its report says and its command line.

Shared by several scripts:

- common: paths, logging, SIGTERM, run metadata, time budget, keeping logs, writing results;
- procfs: CPU, RSS and load readings from /proc, CpuWindow around a run, and `run_meta`
  (what every script records at its start);
- processes: server processes (Broker) and how Mosquitto and our bridge are started;
- loadgen: the Go load generator (build, one run, Scenario, idle mode);
- rocketmq: RocketMQ started and stopped for a bench, its counters, the ours-rocketmq broker;
- report: plain-text and Markdown tables and their cells.

The machinery of one script, named after what it drives:

- versus: run_bench.py's side-by-side runs and comparison report;
- cluster, cluster_report: cluster_bench.py's cluster under test and its report;
- spark, spark_report: spark_bench.py's Spark jobs, stream job and sink, and its report;
- producer: broker_ceiling.py's RocketMQ benchmark Producer;
- pathruns, javaclient, path_report: rocketmq_path.py's users' load (mosquitto_pub/-sub),
  loadgen runs and warm-ups, RocketMQ's Java client (PathClient), and its report;
- protocols: run_bench.py's MQTT 5.0 vs 3.1.1 comparison (it reuses versus' CPU figures and
  pathruns' users' load); single_node.py runs its loads with protocols' runs too.

A module imports only modules above it in these lists, and never a script.
"""
