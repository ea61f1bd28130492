package mqttbridge.interop.paho;

import com.google.gson.JsonArray;
import com.google.gson.JsonObject;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import org.eclipse.paho.mqttv5.client.IMqttToken;
import org.eclipse.paho.mqttv5.client.MqttActionListener;
import org.eclipse.paho.mqttv5.client.MqttAsyncClient;
import org.eclipse.paho.mqttv5.client.MqttCallback;
import org.eclipse.paho.mqttv5.client.MqttConnectionOptions;
import org.eclipse.paho.mqttv5.client.MqttDisconnectResponse;
import org.eclipse.paho.mqttv5.client.persist.MemoryPersistence;
import org.eclipse.paho.mqttv5.common.MqttException;
import org.eclipse.paho.mqttv5.common.MqttMessage;
import org.eclipse.paho.mqttv5.common.MqttSubscription;
import org.eclipse.paho.mqttv5.common.packet.MqttProperties;

/** MQTT 5.0 through Paho's org.eclipse.paho.mqttv5.client.MqttAsyncClient. */
final class V5Client implements Client, MqttCallback {
    private final SessionTrackingClient client;
    private final MqttConnectionOptions options;
    private final Output out;
    private boolean released;
    /** Taken to hand a message over and by close: see messageArrived. */
    private final Object deliveries = new Object();
    private boolean closing;
    /**
     * The server's topic aliases (see messageArrived), under deliveries. Not cleared at a
     * reconnect: a server defines an alias on each connection (topic and alias) before it sends
     * it alone, so a mapping from an earlier connection is replaced before it could be read.
     */
    private final Map<Integer, String> serverAliases = new HashMap<>();

    V5Client(ConnectParams params, Output out) throws MqttException {
        this.out = out;
        this.options = options(params);
        this.client = new SessionTrackingClient(params.serverUri(), params.clientId());
        client.setCallback(this);
        client.setManualAcks(true);
    }

    private static MqttConnectionOptions options(ConnectParams params) {
        MqttConnectionOptions options = new MqttConnectionOptions();
        options.setCleanStart(params.clean());
        options.setKeepAliveInterval(params.keepalive());
        options.setConnectionTimeout(params.connectTimeoutSeconds());
        if (params.sessionExpiry() > 0) {
            options.setSessionExpiryInterval(params.sessionExpiry());
        }
        if (params.topicAliasMaximum() > 0) {
            options.setTopicAliasMaximum(params.topicAliasMaximum());
        }
        // Paho's first retry comes 1 s after the loss, then it doubles the delay up to this
        // maximum: 1 s, so every retry comes 1 s after the last. (1.2.5 never reads the minimum
        // and maximum of setAutomaticReconnectDelay.)
        options.setAutomaticReconnect(params.reconnect());
        options.setMaxReconnectDelay(ConnectParams.RECONNECT_DELAY_MS);
        if (params.username() != null) {
            options.setUserName(params.username());
        }
        if (params.password() != null) {
            options.setPassword(params.password().getBytes(StandardCharsets.UTF_8));
        }
        return options;
    }

    @Override
    public CompletableFuture<JsonObject> connect() throws MqttException {
        Completion done = new Completion();
        client.connect(options, null, done);
        return done.thenApply(token -> {
            JsonObject result = new JsonObject();
            result.addProperty("session_present", token.getSessionPresent());
            return result;
        });
    }

    @Override
    public CompletableFuture<JsonObject> subscribe(String filter, int qos, Long subscriptionId) throws MqttException {
        MqttProperties properties = new MqttProperties();
        if (subscriptionId != null) {
            properties.setSubscriptionIdentifier(subscriptionId.intValue());
        }
        Completion done = new Completion();
        // This overload leaves the identifier to us (the one taking a message listener would
        // assign its own when none is given).
        client.subscribe(new MqttSubscription[] {new MqttSubscription(filter, qos)}, null, done, properties);
        return done.thenApply(token -> {
            JsonArray granted = new JsonArray();
            for (int code : token.getReasonCodes()) {
                granted.add(code);
            }
            JsonObject result = new JsonObject();
            result.add("granted", granted);
            return result;
        });
    }

    @Override
    public CompletableFuture<JsonObject> unsubscribe(String filter) throws MqttException {
        Completion done = new Completion();
        client.unsubscribe(new String[] {filter}, null, done, new MqttProperties());
        return done.thenApply(token -> new JsonObject());
    }

    /**
     * Topic aliases: Paho 1.2.5 manages outgoing aliases itself (ClientState.send) whenever the
     * server's CONNACK allows any, for every publish: the first to a topic goes with the topic
     * and a new alias, later ones with the alias alone. It neither lets its caller send an empty
     * topic (MqttTopicValidator refuses it) nor keeps the caller's alias number: a topic_alias
     * asked for is set on the message, and Paho replaces it with its own. (Were the server to
     * allow no aliases, Paho would send the one asked for, with the topic.)
     */
    @Override
    public CompletableFuture<JsonObject> publish(String topic, byte[] payload, int qos, boolean retain,
            Fields properties) throws MqttException {
        MqttMessage message = new MqttMessage(payload, qos, retain, V5Properties.toPaho(properties));
        Completion done = new Completion();
        client.publish(topic, message, null, done);
        return done.thenApply(token -> {
            refuseFailedAcks(qos, token.getReasonCodes());
            return new JsonObject();
        });
    }

    /**
     * Paho completes a publish normally on a PUBACK with a failure reason code (>= 0x80); the
     * token holds the code. (A failed PUBREC makes Paho drop the connection instead.)
     */
    private static void refuseFailedAcks(int qos, int[] codes) {
        String[] acks = qos == 1 ? new String[] {"PUBACK"} : new String[] {"PUBREC", "PUBCOMP"};
        for (int i = 0; qos > 0 && codes != null && i < Math.min(codes.length, acks.length); i++) {
            if (codes[i] >= 0x80) {
                String reason = new MqttException(codes[i]).getMessage();
                throw new CompletionException(new Failure.Plain(
                        String.format("%s reason code 0x%02x (%s)", acks[i], codes[i], reason)));
            }
        }
    }

    @Override
    public CompletableFuture<JsonObject> disconnect() throws MqttException {
        Completion done = new Completion();
        client.disconnect(null, done);
        return done.thenApply(token -> {
            release();
            return new JsonObject();
        });
    }

    @Override
    public synchronized CompletableFuture<JsonObject> close() throws MqttException {
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
        } catch (MqttException e) {
            System.err.println("closing the mqttv5 client: " + Failure.describe(e));
        }
    }

    // -- MqttCallback: Paho's threads -----------------------------------------------------------

    @Override
    public void disconnected(MqttDisconnectResponse response) {
        if (response.getException() != null) {
            out.connectionLost(Failure.describe(response.getException()));
        } else {
            out.connectionLost(String.format("DISCONNECT from the server, reason code 0x%02x%s",
                    response.getReturnCode(),
                    response.getReasonString() == null ? "" : ": " + response.getReasonString()));
        }
    }

    @Override
    public void mqttErrorOccurred(MqttException error) {
        System.err.println("mqttv5 client error: " + Failure.describe(error));
    }

    /**
     * Acknowledges a QoS 1 message (queues its PUBACK for Paho's sender), then writes the event,
     * under the lock close takes first: so every message the test has seen is acknowledged before
     * close drops the connection (close lets the sender finish). Paho's own PUBACK would come from
     * its callback thread after this returns, racing a close sent right after the event, and the
     * server would deliver the message again. QoS 2 needs nothing: Paho 1.2.5 sends PUBREC on
     * receipt and PUBCOMP on PUBREL whatever the ack mode (a manual ack would add a PUBCOMP).
     *
     * <p>Paho 1.2.5 resolves the server's topic aliases wrongly (eclipse-paho/paho.mqtt.java#866:
     * the empty topic of a PUBLISH sent with an alias alone is taken for a new mapping), so such
     * a message reaches its callback with topic "". What a Java application on 1.2.5 has to do,
     * the driver does: it keeps the server's mappings of this connection itself (serverAliases).
     */
    @Override
    public void messageArrived(String topic, MqttMessage message) {
        synchronized (deliveries) {
            if (closing) {
                return; // not acknowledged: the server keeps it for the session
            }
            topic = resolveAlias(topic, message.getProperties());
            if (message.getQos() == 1) {
                try {
                    client.messageArrivedComplete(message.getId(), 1);
                } catch (MqttException e) {
                    System.err.println("acknowledging a message: " + Failure.describe(e));
                }
            }
            out.message(topic, message.getPayload(), message.getQos(), message.isRetained(),
                    V5Properties.toJson(message.getProperties()));
        }
    }

    /** The topic a server's PUBLISH names, through this connection's aliases where needed. */
    private String resolveAlias(String topic, MqttProperties properties) {
        Integer alias = properties == null ? null : properties.getTopicAlias();
        if (alias == null || alias == 0) {
            return topic;
        }
        if (topic.isEmpty()) {
            return serverAliases.getOrDefault(alias, topic);
        }
        serverAliases.put(alias, topic);
        return topic;
    }

    @Override
    public void deliveryComplete(IMqttToken token) {
        // The publish command's own token reports completion.
    }

    @Override
    public void connectComplete(boolean reconnect, String serverUri) {
        if (reconnect) {
            out.reconnected(client.sessionPresent);
        }
    }

    @Override
    public void authPacketArrived(int reasonCode, MqttProperties properties) {
        System.err.println("mqttv5 client: unexpected AUTH, reason code " + reasonCode);
    }

    /**
     * Paho's client, remembering the session present flag of the last CONNACK: connectComplete
     * does not carry it, and the automatic reconnect uses a token of its own. Paho's reconnect
     * goes through connect(options, context, listener), and its ConnectActionListener calls
     * that listener before connectComplete, so the flag is current when connectComplete runs.
     */
    private static final class SessionTrackingClient extends MqttAsyncClient {
        volatile boolean sessionPresent;

        SessionTrackingClient(String serverUri, String clientId) throws MqttException {
            super(serverUri, clientId, new MemoryPersistence());
        }

        @Override
        public IMqttToken connect(MqttConnectionOptions options, Object context, MqttActionListener listener)
                throws MqttException {
            return super.connect(options, context, new MqttActionListener() {
                @Override
                public void onSuccess(IMqttToken token) {
                    sessionPresent = token.getSessionPresent();
                    listener.onSuccess(token);
                }

                @Override
                public void onFailure(IMqttToken token, Throwable error) {
                    listener.onFailure(token, error);
                }
            });
        }
    }

    /** A Paho action listener as a future of its token. */
    private static final class Completion extends CompletableFuture<IMqttToken> implements MqttActionListener {
        @Override
        public void onSuccess(IMqttToken token) {
            complete(token);
        }

        @Override
        public void onFailure(IMqttToken token, Throwable error) {
            completeExceptionally(error);
        }
    }
}
