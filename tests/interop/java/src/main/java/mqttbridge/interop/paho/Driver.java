package mqttbridge.interop.paho;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParseException;
import com.google.gson.JsonParser;
import java.io.BufferedReader;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.Locale;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

/**
 * The Eclipse Paho Java driver of tests/interop: commands on stdin, results and events on
 * stdout, one JSON object per line (tests/interop/README.md). Commands run one at a time; each
 * waits for its library call at most its timeout_ms.
 */
public final class Driver {
    private static final long DEFAULT_TIMEOUT_MS = 10_000;
    /** The largest Subscription Identifier, a Variable Byte Integer (MQTT 5.0 3.8.2.1.2). */
    private static final long MAX_SUBSCRIPTION_ID = 268_435_455;

    private final Output out;
    /** The client of the last connect command; null before the first. */
    private Client client;

    private Driver(Output out) {
        this.out = out;
    }

    public static void main(String[] args) throws IOException {
        PrintStream stdout = new PrintStream(new FileOutputStream(FileDescriptor.out), false, StandardCharsets.UTF_8);
        // Only the protocol may reach stdout: anything a library prints goes to stderr.
        System.setOut(System.err);
        // Paho's error messages come from resource bundles: English whatever the machine's locale.
        Locale.setDefault(Locale.ROOT);
        Driver driver = new Driver(new Output(stdout));
        BufferedReader stdin = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = stdin.readLine()) != null && driver.handle(line)) {
            // Next command.
        }
        // Paho's timer threads are no daemons: they would keep the JVM alive.
        System.exit(0);
    }

    /** Runs one command line and writes its result; false once the driver is to exit. */
    private boolean handle(String line) {
        if (line.isBlank()) {
            return true;
        }
        Long id = null;
        try {
            Fields command = parse(line);
            id = command.integer("id", Long.MIN_VALUE, Long.MAX_VALUE);
            String op = command.string("op");
            if (op.equals("exit")) {
                out.ok(id, new JsonObject());
                return false;
            }
            long timeoutMs = command.integer("timeout_ms", 1, Integer.MAX_VALUE, DEFAULT_TIMEOUT_MS);
            out.ok(id, start(op, command, timeoutMs).get(timeoutMs, TimeUnit.MILLISECONDS));
        } catch (TimeoutException e) {
            // The library may still finish the call; its result is no longer awaited.
            out.failed(id, "timeout");
        } catch (ExecutionException e) {
            out.failed(id, Failure.describe(e.getCause()));
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            out.failed(id, "interrupted");
            return false;
        } catch (Exception e) {
            // A bad field, or a call the library refused at once: the command fails, not the driver.
            out.failed(id, Failure.describe(e));
        }
        return true;
    }

    private static Fields parse(String line) {
        JsonElement json;
        try {
            json = JsonParser.parseString(line);
        } catch (JsonParseException e) {
            throw new Fields.BadField("not a JSON line: " + e.getMessage());
        }
        if (!json.isJsonObject()) {
            throw new Fields.BadField("a command must be a JSON object");
        }
        return new Fields(json.getAsJsonObject());
    }

    /** Starts the command's library call; the future completes with its result's fields. */
    private CompletableFuture<JsonObject> start(String op, Fields command, long timeoutMs) throws Exception {
        return switch (op) {
            case "connect" -> connect(command, timeoutMs);
            case "subscribe" -> connected().subscribe(
                    command.string("filter"),
                    (int) command.integer("qos", 0, 2),
                    command.has("subscription_id")
                            ? command.integer("subscription_id", 1, MAX_SUBSCRIPTION_ID)
                            : null);
            case "unsubscribe" -> connected().unsubscribe(command.string("filter"));
            case "publish" -> connected().publish(
                    command.string("topic"),
                    command.string("payload").getBytes(StandardCharsets.UTF_8),
                    (int) command.integer("qos", 0, 2, 0),
                    command.bool("retain", false),
                    command.object("properties"));
            case "disconnect" -> connected().disconnect();
            case "close" -> connected().close();
            default -> throw new Fields.BadField("unknown op '" + op + "'");
        };
    }

    /**
     * A new Paho client for each connect: its options and its own state (in-flight messages,
     * reconnect cycle) belong to one connection; the session the tests look at is the server's.
     * A previous client still open is closed first, without DISCONNECT, as by a close command.
     */
    private CompletableFuture<JsonObject> connect(Fields command, long timeoutMs) throws Exception {
        int version = (int) command.integer("version", 4, 5);
        ConnectParams params = ConnectParams.from(command, version, timeoutMs);
        Client previous = client;
        client = null; // until the new one is made: a failure here leaves no client
        if (previous != null) {
            previous.close();
        }
        client = version == 4 ? new V3Client(params, out) : new V5Client(params, out);
        return client.connect();
    }

    private Client connected() {
        if (client == null) {
            throw new Failure.Plain("no client: the first command must be connect");
        }
        return client;
    }
}
