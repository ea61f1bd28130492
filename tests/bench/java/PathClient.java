/*
 * RocketMQ's official Java client (rocketmq-client 5.3.3, remoting protocol) as a fixed-count
 * producer or consumer for tests/bench/rocketmq_path.py. Built by tests/bench/harness/javaclient.py
 * with javac against the jars deploy/rocketmq/fetch.sh caches.
 *
 *   PathClient produce NAMESRV      then, per run, on stdin:
 *       run TOPIC QUEUES SIZE COUNT INFLIGHT DURATION_S TIMEOUT_S RATE    ... go
 *   PathClient consume NAMESRV      then, per run, on stdin:
 *       run TOPIC QUEUES COUNT IDLE_S TIMEOUT_S    ... expect N
 *
 * One JVM of each serves every run of a benchmark, so that runs after the first measure clients
 * whose JIT has compiled the send and consume paths. Each prints one JSON object per line:
 *
 * - produce (one DefaultMQProducer for all runs, as a gateway keeps its producer): per run,
 *   creates TOPIC with QUEUES queues, prints {"event":"ready"}, waits for "go", then sends
 *   until COUNT messages are sent or the publish phase is over; prints {"event":"done"}.
 *   RATE 0: INFLIGHT threads send synchronously (INFLIGHT sends in flight, as -w of RocketMQ's
 *   benchmark Producer), publish phase DURATION_S. RATE > 0: the loadgen's latency mode, paced:
 *   one thread sends on a fixed schedule (message i at start + (i+1)/RATE; one that is more
 *   than 1 ms behind it is a late send and goes at once), each send asynchronous, at most
 *   INFLIGHT unacknowledged (the loadgen's QoS 1 window: a send waits for a free slot after its
 *   stamp, so the wait counts as latency); publish phase DURATION_S * 1.2 + 0.1 s at most.
 * - consume (a new DefaultMQPushConsumer and group per run, client defaults: 20 consume
 *   threads, pull batch 32): subscribes to TOPIC from its first offset, prints
 *   {"event":"ready"} once all QUEUES queues are assigned, counts distinct messages until COUNT
 *   (or the N of an "expect N" line) arrived, nothing new came for IDLE_S after the "expect", or
 *   TIMEOUT_S; prints {"event":"done"}.
 *
 * "exit" or the end of stdin shuts the client down. Every body is SIZE bytes: the sequence number
 * (8 bytes) and the wall clock at the send (8 bytes, ns since the epoch), then 'x'. Times that
 * cross processes (a body's stamp, the consumer's last arrival, which the harness compares with
 * its own time.time_ns()) are wall-clock readings (wallNs: Instant.now(), CLOCK_REALTIME, ns
 * precision on Linux since JDK 15), never System.nanoTime(), whose origin Java leaves to each
 * JVM; durations within one JVM use System.nanoTime().
 */

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicIntegerArray;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.LockSupport;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyContext;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.impl.consumer.DefaultMQPushConsumerImpl;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendCallback;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;

public final class PathClient {
    private static final String ID = "path" + ProcessHandle.current().pid();
    private static final LinkedBlockingQueue<String> COMMANDS = new LinkedBlockingQueue<>();
    private static final String EOF = "exit";

    public static void main(String[] a) {
        try {
            if (a.length != 2 || !(a[0].equals("produce") || a[0].equals("consume"))) {
                System.err.println("usage: see the comment at the top of PathClient.java");
                System.exit(2);
            }
            readStdin();
            if (a[0].equals("produce")) {
                producer(a[1]);
            } else {
                consumer(a[1]);
            }
        } catch (Throwable e) {
            e.printStackTrace();
            emit("{\"event\":\"error\",\"errors\":" + quoted(List.of(e.toString())) + "}");
            System.exit(1);
        }
        System.exit(0);  // the client's own threads must not keep the JVM alive
    }

    private static void emit(String json) {
        synchronized (System.out) {
            System.out.println(json);
            System.out.flush();
        }
    }

    private static String quoted(List<String> items) {
        StringBuilder sb = new StringBuilder("[");
        for (String s : items) {
            String clean = s.replace("\\", "/").replace("\"", "'").replaceAll("[\\r\\n\\t]", " ");
            sb.append(sb.length() > 1 ? "," : "").append('"').append(clean).append('"');
        }
        return sb.append(']').toString();
    }

    /** Stdin lines go to COMMANDS; its end is an "exit". "expect N" is handled at once. */
    private static void readStdin() {
        Thread t = new Thread(() -> {
            BufferedReader in =
                new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
            try {
                for (String line; (line = in.readLine()) != null; ) {
                    if (line.startsWith("expect ")) {
                        Counting.expect(Long.parseLong(line.substring(7).trim()));
                    } else {
                        COMMANDS.add(line.trim());
                    }
                }
            } catch (Exception e) {
                // treated as the end of input
            }
            COMMANDS.add(EOF);
        }, "stdin");
        t.setDaemon(true);
        t.start();
    }

    private static long deadline(double seconds) {
        return System.nanoTime() + (long) (seconds * 1e9);
    }

    /** The wall clock in ns since the epoch: comparable across the processes of the machine. */
    static long wallNs() {
        Instant now = Instant.now();
        return now.getEpochSecond() * 1_000_000_000L + now.getNano();
    }

    // ------------------------------------------------------------------------------ producer

    static void producer(String namesrv) throws Exception {
        DefaultMQProducer producer = new DefaultMQProducer("PG_" + ID);
        producer.setNamesrvAddr(namesrv);
        producer.setInstanceName(ID + "_p");
        producer.start();
        try {
            for (String cmd; !(cmd = COMMANDS.take()).equals(EOF); ) {
                String[] w = cmd.split(" ");
                if (w[0].equals("run") && w.length == 9) {
                    Run run = new Run(w[1], Integer.parseInt(w[3]), Integer.parseInt(w[4]),
                        Integer.parseInt(w[5]), Double.parseDouble(w[6]),
                        Double.parseDouble(w[7]), Double.parseDouble(w[8]));
                    produce(producer, run, Integer.parseInt(w[2]));
                }
            }
        } finally {
            producer.shutdown();
        }
    }

    /** One producer run, as its "run" line gives it. */
    record Run(String topic, int size, int count, int inflight, double durationS,
               double timeoutS, double rate) {}

    /** What the sends of one run came to; its window is the number of sends in flight. */
    static final class Sends {
        final AtomicLong ok = new AtomicLong();
        final AtomicLong failed = new AtomicLong();
        final AtomicLong late = new AtomicLong();
        final AtomicLong inflight = new AtomicLong();
        final AtomicLong maxInflight = new AtomicLong();
        final List<String> errors = Collections.synchronizedList(new ArrayList<>());

        void started() {
            maxInflight.accumulateAndGet(inflight.incrementAndGet(), Math::max);
        }

        void ended(String error) {
            inflight.decrementAndGet();
            if (error == null) {
                ok.incrementAndGet();
            } else if (failed.incrementAndGet() <= 5) {
                errors.add(error);
            }
        }

        static String status(SendResult r) {
            return r.getSendStatus() == SendStatus.SEND_OK ? null : "status " + r.getSendStatus();
        }
    }

    static void produce(DefaultMQProducer producer, Run run, int queues) throws Exception {
        producer.createTopic(producer.getCreateTopicKey(), run.topic(), queues, null);
        long until = deadline(30);
        while (producer.fetchPublishMessageQueues(run.topic()).size() < queues) {
            if (System.nanoTime() > until) {
                throw new IllegalStateException("topic " + run.topic() + " has no route after 30 s");
            }
            Thread.sleep(50);  // until the broker has registered the new topic
        }
        emit("{\"event\":\"ready\"}");
        String go = COMMANDS.take();
        if (!go.equals("go")) {
            throw new IllegalStateException("expected go, got " + go);
        }
        Sends sends = new Sends();
        long start = System.nanoTime();
        if (run.rate() > 0) {
            paced(producer, run, sends, start);
        } else {
            threads(producer, run, sends, start);
        }
        long end = System.nanoTime();
        emit(String.format("{\"event\":\"done\",\"sent\":%d,\"failed\":%d,\"late\":%d,"
            + "\"max_inflight\":%d,\"start_ns\":%d,\"end_ns\":%d,\"errors\":%s}",
            sends.ok.get(), sends.failed.get(), sends.late.get(), sends.maxInflight.get(), start,
            end, quoted(sends.errors)));
    }

    /** A body of `size` bytes: `seq`, the wall clock now, then the template's 'x'. */
    static byte[] body(byte[] template, long seq) {
        byte[] body = template.clone();
        ByteBuffer.wrap(body).putLong(seq).putLong(wallNs());
        return body;
    }

    static byte[] template(int size) {
        byte[] template = new byte[size];
        Arrays.fill(template, (byte) 'x');
        return template;
    }

    /** RATE 0: `inflight` threads, each sending synchronously, as fast as the broker answers. */
    static void threads(DefaultMQProducer producer, Run run, Sends sends, long start)
        throws InterruptedException {
        byte[] template = template(run.size());
        AtomicLong next = new AtomicLong();
        long stopAt = Math.min(start + (long) (run.durationS() * 1e9), deadline(run.timeoutS()));
        List<Thread> threads = new ArrayList<>();
        for (int t = 0; t < run.inflight(); t++) {
            Thread th = new Thread(() -> {
                for (long seq; (seq = next.getAndIncrement()) < run.count(); ) {
                    if (System.nanoTime() > stopAt) {
                        break;
                    }
                    sends.started();
                    String error;
                    try {
                        error = Sends.status(
                            producer.send(new Message(run.topic(), body(template, seq))));
                    } catch (Exception e) {
                        error = e.toString();
                    }
                    sends.ended(error);
                }
            }, "sender-" + t);
            th.start();
            threads.add(th);
        }
        for (Thread th : threads) {
            th.join();
        }
    }

    /**
     * RATE > 0: the loadgen's latency mode. One thread follows the schedule, stamps each body
     * when it sends it and hands it to the client's asynchronous send; at most `inflight` sends
     * are unacknowledged. Returns once every send has its answer (or the run's timeout).
     */
    static void paced(DefaultMQProducer producer, Run run, Sends sends, long start)
        throws InterruptedException {
        byte[] template = template(run.size());
        Semaphore window = new Semaphore(run.inflight());
        long interval = (long) (1e9 / run.rate());
        long stopAt = deadline(run.timeoutS());
        long pubEnd = Math.min(start + (long) (run.durationS() * 1.2e9) + 100_000_000L, stopAt);
        SendCallback answered = new SendCallback() {
            @Override
            public void onSuccess(SendResult r) {
                sends.ended(Sends.status(r));
                window.release();
            }

            @Override
            public void onException(Throwable e) {
                sends.ended(e.toString());
                window.release();
            }
        };
        long sched = start;
        for (long seq = 0; seq < run.count(); seq++) {
            sched += interval;
            long now = System.nanoTime();
            if (now < sched) {
                for (long d; (d = sched - System.nanoTime()) > 0; ) {
                    LockSupport.parkNanos(d);
                }
            } else if (now - sched > 1_000_000L) {
                sends.late.incrementAndGet();
            }
            if (now > pubEnd) {
                break;
            }
            byte[] body = body(template, seq);
            if (!window.tryAcquire(Math.max(0, stopAt - System.nanoTime()), TimeUnit.NANOSECONDS)) {
                break;  // the run's timeout, with `inflight` sends unanswered
            }
            sends.started();
            try {
                producer.send(new Message(run.topic(), body), answered);
            } catch (Exception e) {
                sends.ended(e.toString());
                window.release();
            }
        }
        long left = Math.max(0, stopAt - System.nanoTime()) + 5_000_000_000L;
        if (!window.tryAcquire(run.inflight(), left, TimeUnit.NANOSECONDS)) {
            long unanswered = sends.inflight.get();
            sends.failed.addAndGet(unanswered);
            sends.errors.add(unanswered + " sends unanswered at the timeout");
        }
    }

    // ------------------------------------------------------------------------------ consumer

    /** What the consume listener of the current run counts. */
    static final class Counting {
        static final Object LOCK = new Object();
        static volatile Counting current;

        final int count;
        final AtomicIntegerArray seen;
        final long[] latencyNs;
        final AtomicLong distinct = new AtomicLong();
        final AtomicLong duplicates = new AtomicLong();
        final AtomicLong foreign = new AtomicLong();
        final AtomicLong lastNs = new AtomicLong();  // System.nanoTime(): the idle rule
        final AtomicLong lastWallNs = new AtomicLong();  // wallNs(): for the harness
        final AtomicLong target;
        final AtomicLong expectAt = new AtomicLong();

        Counting(int count) {
            this.count = count;
            this.seen = new AtomicIntegerArray(count);
            this.latencyNs = new long[count];
            this.target = new AtomicLong(count);
        }

        static void expect(long n) {
            Counting c = current;
            if (c != null) {
                c.target.set(n);
                c.expectAt.set(System.nanoTime());
                synchronized (LOCK) {
                    LOCK.notifyAll();
                }
            }
        }

        void receive(List<MessageExt> msgs) {
            long now = System.nanoTime();
            long wall = wallNs();
            for (MessageExt m : msgs) {
                ByteBuffer body = ByteBuffer.wrap(m.getBody());
                long seq = body.remaining() >= 16 ? body.getLong() : -1;
                if (seq < 0 || seq >= count) {
                    foreign.incrementAndGet();
                } else if (seen.getAndSet((int) seq, 1) == 0) {
                    latencyNs[(int) seq] = wall - body.getLong();
                    lastNs.accumulateAndGet(now, Math::max);
                    lastWallNs.accumulateAndGet(wall, Math::max);
                    if (distinct.incrementAndGet() >= target.get()) {
                        synchronized (LOCK) {
                            LOCK.notifyAll();
                        }
                    }
                } else {
                    duplicates.incrementAndGet();
                }
            }
        }

        /** Until every expected message arrived, the idle time after "expect" or the deadline. */
        String await(double idleS, double timeoutS) throws InterruptedException {
            long end = deadline(timeoutS);
            long idleNs = (long) (idleS * 1e9);
            synchronized (LOCK) {
                while (distinct.get() < target.get()) {
                    long now = System.nanoTime();
                    if (now > end) {
                        return "timeout";
                    }
                    long since = Math.max(lastNs.get(), expectAt.get());
                    if (expectAt.get() != 0 && now - since > idleNs) {
                        return "idle";
                    }
                    LOCK.wait(50);
                }
            }
            return "complete";
        }

        String result(String stop) {
            long n = distinct.get();
            long[] lat = new long[(int) n];
            int j = 0;
            for (int i = 0; i < count && j < n; i++) {
                if (seen.get(i) == 1) {
                    lat[j++] = latencyNs[i];
                }
            }
            lat = Arrays.copyOf(lat, j);
            Arrays.sort(lat);
            return String.format("{\"event\":\"done\",\"received\":%d,\"duplicates\":%d,"
                + "\"foreign\":%d,\"expected\":%d,\"last_wall_ns\":%d,"
                + "\"stop_reason\":\"%s\",\"latency\":{\"min_ms\":%.3f,\"p50_ms\":%.3f,"
                + "\"p90_ms\":%.3f,\"p99_ms\":%.3f,\"max_ms\":%.3f,\"samples\":%d}}", n,
                duplicates.get(), foreign.get(), target.get(), lastWallNs.get(), stop,
                pct(lat, 0.0), pct(lat, 0.50), pct(lat, 0.90), pct(lat, 0.99), pct(lat, 1.0),
                lat.length);
        }
    }

    static void consumer(String namesrv) throws Exception {
        int run = 0;
        for (String cmd; !(cmd = COMMANDS.take()).equals(EOF); ) {
            String[] w = cmd.split(" ");
            if (w[0].equals("run") && w.length == 6) {
                consume(namesrv, ++run, w[1], Integer.parseInt(w[2]), Integer.parseInt(w[3]),
                    Double.parseDouble(w[4]), Double.parseDouble(w[5]));
            }
        }
    }

    static void consume(String namesrv, int run, String topic, int queues, int count,
                        double idleS, double timeoutS) throws Exception {
        Counting counting = new Counting(count);
        Counting.current = counting;
        DefaultMQPushConsumer consumer = new DefaultMQPushConsumer("CG_" + ID + "_" + run);
        consumer.setNamesrvAddr(namesrv);
        consumer.setInstanceName(ID + "_c" + run);
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.subscribe(topic, "*");
        consumer.registerMessageListener((List<MessageExt> msgs, ConsumeConcurrentlyContext c) -> {
            counting.receive(msgs);
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        var impl = consumer.getDefaultMQPushConsumerImpl();
        long subscribedVersion =
            impl.getRebalanceImpl().getSubscriptionInner().get(topic).getSubVersion();
        consumer.start();
        try {
            awaitPulling(impl, topic, queues, subscribedVersion);
            emit("{\"event\":\"ready\"}");
            emit(counting.result(counting.await(idleS, timeoutS)));
        } finally {
            Counting.current = null;
            consumer.shutdown();
        }
    }

    /**
     * Until every queue of TOPIC is assigned and has a pull outstanding that the broker accepts.
     *
     * <p>The rebalance that assigns the queues raises the subscription's version and tells the
     * broker in a heartbeat, but the client skips that heartbeat when another one holds its lock
     * (start()'s, the periodic one); the broker then refuses every pull as "subscription not
     * latest" until the next periodic heartbeat, 30 s later. So: wait for the assignment and the
     * new version, send the heartbeat, and wait until each queue has issued a pull after it.
     */
    static void awaitPulling(DefaultMQPushConsumerImpl impl, String topic, int queues,
                             long subscribedVersion) throws Exception {
        long until = deadline(30);
        var table = impl.getRebalanceImpl().getProcessQueueTable();
        var subscription = impl.getRebalanceImpl().getSubscriptionInner().get(topic);
        while (table.size() < queues || subscription.getSubVersion() == subscribedVersion) {
            if (System.nanoTime() > until) {
                throw new IllegalStateException(
                    "consumer not assigned " + queues + " queues of " + topic + " in 30 s");
            }
            // A route looked up before the topic reached the NameServer is looked up again by
            // the client only every 30 s: look now and rebalance.
            impl.getmQClientFactory().updateTopicRouteInfoFromNameServer(topic);
            impl.getmQClientFactory().rebalanceImmediately();
            Thread.sleep(20);
        }
        while (!impl.getmQClientFactory().sendHeartbeatToAllBrokerWithLock()) {
            if (System.nanoTime() > until) {
                throw new IllegalStateException("no heartbeat sent in 30 s");
            }
            Thread.sleep(20);
        }
        long heartbeatAt = System.currentTimeMillis();
        while (table.values().stream().anyMatch(pq -> pq.getLastPullTimestamp() <= heartbeatAt)) {
            if (System.nanoTime() > until) {
                throw new IllegalStateException("no pull of " + topic + " after the heartbeat");
            }
            Thread.sleep(20);
        }
    }

    private static double pct(long[] sorted, double q) {
        if (sorted.length == 0) {
            return 0.0;
        }
        int i = (int) Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1);
        return sorted[Math.max(0, i)] / 1e6;
    }
}
