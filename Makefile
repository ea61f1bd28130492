# Two commands do all set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
SPARK_STAMP := $(VENV)/.spark-stamp
COMPILE_STAMP := $(VENV)/.compiled-stamp
# The modules setup.py compiles with mypyc (its COMPILED list): a change to one rebuilds them.
COMPILED_SRC := $(shell sed -n 's/^    "\(bridge\/.*\.py\)",$$/\1/p' setup.py)
LISTEN ?= 127.0.0.1:1883
DATA   ?= ./data
# Four pytest-xdist workers: most tests wait on servers and timers, so on two cores the workers
# overlap the waits (tests/README.md: how tests are spread over them). PYTEST_ARGS= runs serially.
# -rs prints each skipped test's reason, so a run shows that none of them stands for a missing server.
PYTEST_ARGS ?= -n 4 --durations=5 -rs
N      ?= 3
DEMO_ARGS ?=

.PHONY: install install-spark compile pure run test test-deps interop-clients dist lint bench hostile nemesis mutation clean cluster cluster-stop spark-demo path-steps

install: $(STAMP)

# The editable install is pure Python (MQTT_BRIDGE_COMPILE=0); `compile` builds the hot-path
# modules in place with mypyc, once and again whenever one of them changes.
$(STAMP): pyproject.toml setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	MQTT_BRIDGE_COMPILE=0 $(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

compile: $(COMPILE_STAMP)

# With Debian's ccache on PATH (`make test-deps` installs it), gcc's objects are kept in
# ~/.cache/ccache: a fresh clone whose hot path is unchanged compiles it in seconds, not a
# minute; C that changed is compiled as ever. Paths are hashed relative to the clone, so a
# clone elsewhere finds them too. Without ccache, the plain compiler.
CCACHE_CC = $(if $(shell command -v ccache),CCACHE_BASEDIR=$(CURDIR) CCACHE_NOHASHDIR=1 \
	CC="ccache $(shell $(BIN)/python -c 'import sysconfig; print(sysconfig.get_config_var("CC"))')")

$(COMPILE_STAMP): $(STAMP) setup.py $(COMPILED_SRC)
	# Everything built is dated when the build started: a source edited during it stays newer,
	# so the next make rebuilds it and importing bridge refuses the stale module meanwhile.
	touch $(COMPILE_STAMP).start
	$(CCACHE_CC) $(BIN)/python setup.py -q build_ext --inplace
	# A module whose C code did not change keeps its old build time: all of them are current now.
	find bridge -name '*.so' -exec touch -r $(COMPILE_STAMP).start {} +
	mv $(COMPILE_STAMP).start $(COMPILE_STAMP)

# Back to pure Python (slower, same behaviour): remove the compiled modules.
pure:
	find bridge -name '*.so' -delete
	rm -f $(COMPILE_STAMP)

# PySpark and its Python dependencies (pyarrow, pandas, matplotlib), and Delta Lake's jars in
# ~/.cache/mqtt-bridge (the BI tables' format): for the Spark source, jobs, tests and demo; not
# needed to run a gateway.
install-spark: $(SPARK_STAMP)

$(SPARK_STAMP): $(STAMP)
	MQTT_BRIDGE_COMPILE=0 $(BIN)/python -m pip install -q -e '.[test,spark]'
	deploy/spark/fetch-delta.sh >/dev/null
	touch $(SPARK_STAMP)

run: compile
	$(BIN)/mqtt-bridge --listen $(LISTEN) --data-dir $(DATA)

test-deps: install install-spark compile
	deploy/ensure-debian-packages.sh mosquitto mosquitto-clients:mosquitto_pub \
		default-jre-headless:java maven:mvn \
		redis-server redis-tools:redis-cli redis-sentinel haproxy iproute2:ss procps:ps shellcheck \
		chromium chromium-driver:chromedriver openssl ccache docker-compose prometheus \
		nftables:nft faketime
	deploy/rocketmq/fetch.sh
	$(MAKE) interop-clients

# The programs that drive MQTT.js, Eclipse Paho Java and Go, and rumqttc in tests/interop, each
# built once per machine from its pinned versions into ~/.cache/mqtt-bridge/interop (Node.js,
# Maven, Go and Cargo are the machine's; tests/interop/README.md).
interop-clients: install
	$(BIN)/python tests/interop/build.py

# A release: the sdist and, built from it, the wheel with the hot path compiled (a compiler that
# fails stops the build instead of leaving a pure-Python wheel). `pip install dist/*.whl`.
dist: install
	rm -rf dist
	MQTT_BRIDGE_COMPILE=required $(BIN)/python -m build --outdir dist

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy bridge/mqtt bridge/router bridge/session.py bridge/access/auth.py bridge/access/hashes.py \
		bridge/access/passwd.py bridge/access/acl.py bridge/access/ttlcache.py bridge/access/scram.py \
		bridge/access/explain.py bridge/access/ownership.py bridge/access/reads.py \
		bridge/access/bans.py bridge/access/banlist.py \
		bridge/node/presubscribe.py bridge/node/positions.py bridge/node/retained.py bridge/node/quotas.py bridge/node/retained_copies.py bridge/node/stamp.py bridge/node/roles.py \
		bridge/node/qos0_flow.py bridge/node/early_reads.py bridge/node/qos2_in.py bridge/node/deadlines.py bridge/node/wakes.py \
		bridge/cluster/host.py bridge/counters.py bridge/config.py bridge/settings.py bridge/checks.py bridge/state.py \
		bridge/listeners/settings_checks.py bridge/access/settings_checks.py bridge/cluster/settings_checks.py \
		bridge/operations/settings_checks.py bridge/node/settings_checks.py bridge/storage/settings_checks.py \
		bridge/storage/rocketmq/security.py \
		bridge/cluster/wire.py bridge/cluster/announce.py bridge/cluster/handshake.py \
		bridge/cluster/peer_auth.py bridge/cluster/peers.py bridge/cluster/trust.py bridge/cluster/releases.py \
		bridge/cluster/interest.py \
		bridge/operations/node_calls.py \
		bridge/storage/rocketmq/mapping.py bridge/storage/rocketmq/wire.py \
		bridge/storage/rocketmq/messages.py bridge/storage/rocketmq/bytes.py \
		bridge/storage/rocketmq/queues.py bridge/storage/rocketmq/reads.py \
		bridge/storage/rocketmq/sendframe.py bridge/storage/rocketmq/groups.py \
		bridge/storage/rocketmq/acl.py bridge/storage/rocketmq/tls.py \
		bridge/storage/filelog/segments.py bridge/storage/filelog/undo.py bridge/storage/filelog/holds.py \
	bridge/storage/metadata.py bridge/node/copies.py bridge/node/admission.py bridge/node/wills.py bridge/node/registry_entries.py \
	bridge/node/delayed.py bridge/storage/base.py bridge/storage/message.py bridge/fields.py \
	bridge/listeners/v5.py bridge/listeners/link.py bridge/listeners/enhanced_auth.py \
	bridge/listeners/inbound.py bridge/listeners/delivery_acks.py bridge/listeners/preauth.py \
bridge/listeners/connecting.py bridge/operations/admin_clients.py \
	bridge/access/login_queue.py bridge/access/login_guard.py \
	bridge/access/ratelimit.py bridge/access/watch.py bridge/listeners/origins.py bridge/node/flow.py \
		bridge/logtext.py bridge/private_files.py bridge/listeners/exposure.py \
		spark/intervals.py spark/shifts.py spark/presence.py spark/options.py spark/telemetry.py spark/delta.py

# The tests start hundreds of Python processes (bridges, notify, Spark's workers) that import
# bridge/, notify/ and spark/: their bytecode is written once here, since an environment with
# PYTHONDONTWRITEBYTECODE set would have each of them compile the sources again (about a third
# of a bridge's start-up CPU). A stale file is only recompiled in memory, never wrong.
test: test-deps lint
	$(BIN)/python -m compileall -q bridge notify spark
	$(BIN)/pytest $(PYTEST_ARGS)

bench: test-deps
	$(BIN)/python tests/bench/run_bench.py $(BENCH_ARGS)
	$(BIN)/python tests/bench/single_node.py
	# The same loads with the embedded store's `sync = interval` (PUBACK once written, an
	# fdatasync every 10 ms), beside Mosquitto again.
	$(BIN)/python tests/bench/single_node.py --results-dir tests/bench/results/sync-interval \
		--ours-cmd '{python} -m bridge --listen {host}:{port} --data-dir {data_dir} --log-level warning --set sync=interval'
	$(BIN)/python tests/bench/durability_contrast.py
	$(BIN)/python tests/bench/conn_capacity.py
	$(BIN)/python tests/bench/cluster_bench.py
	$(BIN)/python tests/bench/rocketmq_path.py
	$(BIN)/python tests/bench/multi_filter.py
	$(BIN)/python tests/bench/acl_delivery.py
	$(BIN)/python tests/bench/resume_moves.py
	$(BIN)/python tests/bench/subscribe_latency.py
	$(BIN)/python -m tests.bench.login_flood
	$(BIN)/python tests/bench/spark_bench.py

# Where a QoS 1 message's time goes on the RocketMQ path, step by step, read off a loopback
# capture (not part of `make bench`: it needs tcpdump and root); e.g. `make path-steps
# STEPS_ARGS="--rate 200 --seconds 10"`.
path-steps: test-deps
	deploy/ensure-debian-packages.sh tcpdump
	$(BIN)/python tests/bench/path_steps.py $(STEPS_ARGS)

# Hostile clients against one bridge for SECONDS (default 180; not part of `make test`): mutated
# packets, slowloris, half-open sockets, a bad-login flood and subscribers that never read from
# 127.0.0.2-9, honest QoS 1 traffic from 127.0.0.1; fails if an acknowledged message is lost, the
# RSS grows 256 MiB, a new login is slow or the log has a traceback (tests/faults/hostile_run.py).
SECONDS ?= 180
hostile: install
	$(BIN)/python -m tests.faults.hostile_run --seconds $(SECONDS)

# Random schedules of overlapping faults on a cluster in network namespaces (not part of `make
# test`, which runs each fault once; root, nftables): RUNS runs of NEMESIS_SECONDS each, seeded
# (NEMESIS_SEED replays a printed seed). About a minute and a half per run.
RUNS ?= 20
NEMESIS_SECONDS ?= 60
nemesis: test-deps
	$(BIN)/python -m tests.nemesis.schedules --runs $(RUNS) --seconds $(NEMESIS_SECONDS) \
		$(if $(NEMESIS_SEED),--seed $(NEMESIS_SEED))

# Mutation testing of the pure rooms (not part of `make test`; tests/README.md "Mutation testing"):
# mutmut changes one thing at a time in bridge/mqtt, router, session.py, access's decisions and
# spark's table logic, and the room's unit tests must notice. Pure Python only (it removes the
# compiled modules: `make compile` brings them back). Niced, one room at a time, each bounded.
# ROOMS="router session" runs some; tests/mutation.py lists them and the tests each one uses.
MUTATION_STAMP := $(VENV)/.mutation-stamp
ROOMS ?=
MUTATION_JOBS ?= 2
MUTATION_ROOM_TIMEOUT ?= 3600
$(MUTATION_STAMP): $(STAMP)
	MQTT_BRIDGE_COMPILE=0 $(BIN)/python -m pip install -q -e '.[test,mutation]'
	touch $(MUTATION_STAMP)

mutation: $(MUTATION_STAMP) pure
	nice -n 19 $(BIN)/python -m tests.mutation_run --jobs $(MUTATION_JOBS) \
		--room-timeout $(MUTATION_ROOM_TIMEOUT) $(ROOMS)

# The factory BI pipeline end to end in a few minutes (spark/demo.py): RocketMQ, a bridge,
# simulated devices, the streaming and back-fill jobs, their tables and a chart, all under
# ./.spark-demo; everything it starts is stopped at the end. Options: DEMO_ARGS="--help".
spark-demo: install install-spark
	deploy/ensure-debian-packages.sh mosquitto mosquitto-clients:mosquitto_pub \
		default-jre-headless:java maven:mvn
	deploy/rocketmq/fetch.sh
	$(BIN)/python -m spark.demo $(DEMO_ARGS)

# A local N-node cluster behind HAProxy on 127.0.0.1:1883 (Redis, RocketMQ, N bridges).
# RocketMQ's shape (deploy/rocketmq/env.sh): RMQ_GROUPS broker groups (default 1: broker-a;
# then broker-b, ...), with RMQ_SLAVES=1 a slave each (masters SYNC_MASTER), e.g.
#   RMQ_GROUPS=2 RMQ_SLAVES=1 make cluster N=3    # 2 masters + 2 slaves, 256 MiB heap each
# deploy/rocketmq/add-group.sh broker-c (with ROCKETMQ_DATA_DIR=data/cluster/rocketmq) adds a
# group to the running cluster; kill-broker.sh / start-broker.sh GROUP ID stop and start one.
cluster: install
	deploy/ensure-debian-packages.sh default-jre-headless:java maven:mvn \
		redis-server redis-tools:redis-cli haproxy
	$(if $(RMQ_GROUPS),RMQ_GROUPS=$(RMQ_GROUPS)) $(if $(RMQ_SLAVES),RMQ_SLAVES=$(RMQ_SLAVES)) \
		deploy/cluster/start.sh $(N)

cluster-stop:
	deploy/cluster/stop.sh

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache .mypy_cache mutants
