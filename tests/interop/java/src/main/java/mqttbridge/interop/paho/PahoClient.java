package mqttbridge.interop.paho;

import com.google.gson.JsonArray;
import com.google.gson.JsonObject;
import java.util.concurrent.CompletableFuture;

/**
 * What V3Client (mqttv3) and V5Client (mqttv5) do alike: the options they share, connect,
 * disconnect and close, the hand-over of a message, the reconnected event.
 *
 * <p>Paho's two MqttAsyncClient classes share no type, but declare the calls used here with the
 * same signatures, and so do their connect options classes. Each version subclasses both, taking
 * on an interface of this class with the methods it inherits: O is its options class
 * (ConnectOptions), C its client class (AsyncClient), which takes O and a Completion as its
 * action listener.
 */
abstract class PahoClient<O extends PahoClient.ConnectOptions,
        C extends PahoClient.AsyncClient<? super O, ? super Completion>> implements Client {
    /**
     * The calls of Paho's MqttAsyncClient used here, O being its options class and L its action
     * listener; all but acknowledge are Paho's own.
     */
    interface AsyncClient<O, L> {
        Object connect(O options, Object userContext, L callback) throws Exception;

        Object disconnect(Object userContext, L callback) throws Exception;

        void disconnectForcibly(long quiesceTimeout, long disconnectTimeout, boolean sendDisconnect)
                throws Exception;

        boolean isConnected();

        void setManualAcks(boolean manualAcks);

        /** Acknowledges a message that arrived, as the version needs (see deliver). */
        void acknowledge(int messageId, int qos) throws Exception;

        void close(boolean force) throws Exception;
    }

    /** The settings of Paho's connect options both versions take alike. */
    interface ConnectOptions {
        void setKeepAliveInterval(int seconds);

        void setConnectionTimeout(int seconds);

        void setAutomaticReconnect(boolean reconnect);

        void setMaxReconnectDelay(int milliseconds);

        void setUserName(String userName);
    }

    protected final O options;
    protected final C client;
    protected final Output out;
    /** "mqttv3" or "mqttv5", for diagnostics. */
    private final String library;
    private boolean released;
    /** Taken to hand a message over and by close: see deliver. */
    private final Object deliveries = new Object();
    private boolean closing;
    /** The session present flag of the last CONNACK: see trackSession. */
    private volatile boolean sessionPresent;

    /** Sets what the versions' options share; the subclass sets the rest, and the callback. */
    PahoClient(String library, O options, C client, ConnectParams params, Output out) {
        this.library = library;
        this.options = options;
        this.client = client;
        this.out = out;
        options.setKeepAliveInterval(params.keepalive());
        options.setConnectionTimeout(params.connectTimeoutSeconds());
        // Paho's first retry comes 1 s after the loss, then it doubles the delay up to this
        // maximum: 1 s, so every retry comes 1 s after the last. (mqttv5 1.2.5 never reads the
        // minimum and maximum of setAutomaticReconnectDelay.)
        options.setAutomaticReconnect(params.reconnect());
        options.setMaxReconnectDelay(ConnectParams.RECONNECT_DELAY_MS);
        if (params.username() != null) {
            options.setUserName(params.username());
        }
        client.setManualAcks(true);
    }

    @Override
    public final CompletableFuture<JsonObject> connect() throws Exception {
        Completion done = new Completion();
        // This client as the context: Paho's automatic reconnect hands it back (trackSession).
        client.connect(options, this, done);
        return done.thenApply(reply -> {
            JsonObject result = new JsonObject();
            result.addProperty("session_present", reply.sessionPresent());
            return result;
        });
    }

    /**
     * Makes `wrapper`, the Completion a version's client wraps around the listener of each connect
     * (Paho's own at an automatic reconnect), record the CONNACK's session present flag before
     * that listener runs: connectComplete does not carry the flag, and the reconnect uses a token
     * of its own. Paho's reconnect goes through connect(options, context, listener), with the
     * context of the first connect (the PahoClient), and its ConnectActionListener calls that
     * listener before connectComplete, so the flag is current when connectComplete runs.
     */
    static Completion trackSession(Object context, Completion wrapper) {
        PahoClient<?, ?> owner = (PahoClient<?, ?>) context;
        // Registered before completion: runs inside complete, before the wrapped listener.
        wrapper.thenAccept(reply -> owner.sessionPresent = reply.sessionPresent());
        return wrapper;
    }

    /** Result: granted, the SUBACK's return / reason codes. */
    static JsonObject granted(Completion.Reply reply) {
        JsonArray granted = new JsonArray();
        for (int code : reply.codes()) {
            granted.add(code);
        }
        JsonObject result = new JsonObject();
        result.add("granted", granted);
        return result;
    }

    @Override
    public final CompletableFuture<JsonObject> disconnect() throws Exception {
        Completion done = new Completion();
        client.disconnect(null, done);
        return done.thenApply(reply -> {
            release();
            return new JsonObject();
        });
    }

    @Override
    public final synchronized CompletableFuture<JsonObject> close() throws Exception {
        if (!released) {
            synchronized (deliveries) {
                closing = true;
            }
            // The client reads its options when the connection is lost: no reconnect starts now,
            // and a retry already scheduled finds the client closed and stops.
            options.setAutomaticReconnect(false);
            // Quiescing only lets a live connection send what is queued.
            long quiesceMs = client.isConnected() ? ConnectParams.CLOSE_QUIESCE_MS : 0;
            client.disconnectForcibly(quiesceMs, 0, false);
            release();
        }
        return CompletableFuture.completedFuture(new JsonObject());
    }

    /** Frees the client's threads; Paho refuses a later call with "client is closed". */
    private synchronized void release() {
        if (released) {
            return;
        }
        released = true;
        try {
            client.close(true);
        } catch (Exception e) {
            System.err.println("closing the " + library + " client: " + Failure.describe(e));
        }
    }

    // -- Paho's threads --------------------------------------------------------------------------

    /**
     * Hands a message over from messageArrived: acknowledges it (queues its PUBACK / PUBCOMP for
     * Paho's sender), then writes the event (report), under the lock close takes first: so every
     * message the test has seen is acknowledged before close drops the connection (close lets the
     * sender finish). Paho's own acks would come from its callback thread after messageArrived
     * returns, racing a close sent right after the event, and the server would deliver the
     * message again.
     */
    protected final void deliver(int messageId, int qos, Runnable report) {
        synchronized (deliveries) {
            if (closing) {
                return; // not acknowledged: the server keeps it for the session
            }
            try {
                client.acknowledge(messageId, qos);
            } catch (Exception e) {
                System.err.println("acknowledging a message: " + Failure.describe(e));
            }
            report.run();
        }
    }

    /** MqttCallbackExtended's (mqttv3) and MqttCallback's (mqttv5), declared alike. */
    public final void connectComplete(boolean reconnect, String serverUri) {
        if (reconnect) {
            out.reconnected(sessionPresent);
        }
    }
}
