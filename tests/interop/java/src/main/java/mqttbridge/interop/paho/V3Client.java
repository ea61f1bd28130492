package mqttbridge.interop.paho;

import com.google.gson.JsonArray;
import com.google.gson.JsonObject;
import java.util.concurrent.CompletableFuture;
import org.eclipse.paho.client.mqttv3.IMqttActionListener;
import org.eclipse.paho.client.mqttv3.IMqttDeliveryToken;
import org.eclipse.paho.client.mqttv3.IMqttToken;
import org.eclipse.paho.client.mqttv3.MqttAsyncClient;
import org.eclipse.paho.client.mqttv3.MqttCallbackExtended;
import org.eclipse.paho.client.mqttv3.MqttConnectOptions;
import org.eclipse.paho.client.mqttv3.MqttException;
import org.eclipse.paho.client.mqttv3.MqttMessage;
import org.eclipse.paho.client.mqttv3.persist.MemoryPersistence;

/** MQTT 3.1.1 through Paho's org.eclipse.paho.client.mqttv3.MqttAsyncClient. */
final class V3Client implements Client, MqttCallbackExtended {
    private final SessionTrackingClient client;
    private final MqttConnectOptions options;
    private final Output out;
    private boolean released;
    /** Taken to hand a message over and by close: see messageArrived. */
    private final Object deliveries = new Object();
    private boolean closing;

    V3Client(ConnectParams params, Output out) throws MqttException {
        this.out = out;
        this.options = options(params);
        this.client = new SessionTrackingClient(params.serverUri(), params.clientId());
        client.setCallback(this);
        client.setManualAcks(true);
    }

    private static MqttConnectOptions options(ConnectParams params) {
        MqttConnectOptions options = new MqttConnectOptions();
        // Exactly 3.1.1: Paho's default would retry a refused CONNECT as MQTT 3.1.
        options.setMqttVersion(MqttConnectOptions.MQTT_VERSION_3_1_1);
        options.setCleanSession(params.clean());
        options.setKeepAliveInterval(params.keepalive());
        options.setConnectionTimeout(params.connectTimeoutSeconds());
        // Paho's first retry comes 1 s after the loss, then it doubles the delay up to this
        // maximum: 1 s, so every retry comes 1 s after the last.
        options.setAutomaticReconnect(params.reconnect());
        options.setMaxReconnectDelay(ConnectParams.RECONNECT_DELAY_MS);
        if (params.username() != null) {
            options.setUserName(params.username());
        }
        if (params.password() != null) {
            options.setPassword(params.password().toCharArray());
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
        if (subscriptionId != null) {
            throw new Fields.BadField("subscription_id is MQTT 5.0 only (version 5)");
        }
        Completion done = new Completion();
        client.subscribe(filter, qos, null, done);
        return done.thenApply(token -> {
            JsonArray granted = new JsonArray();
            for (int code : token.getGrantedQos()) {
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
        client.unsubscribe(filter, null, done);
        return done.thenApply(token -> new JsonObject());
    }

    @Override
    public CompletableFuture<JsonObject> publish(String topic, byte[] payload, int qos, boolean retain,
            Fields properties) throws MqttException {
        if (!properties.names().isEmpty()) {
            throw new Fields.BadField("properties are MQTT 5.0 only (version 5)");
        }
        Completion done = new Completion();
        // Paho completes a QoS 0 token once the message is written, QoS 1 on PUBACK, QoS 2 on PUBCOMP.
        client.publish(topic, payload, qos, retain, null, done);
        return done.thenApply(token -> new JsonObject());
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
            System.err.println("closing the mqttv3 client: " + Failure.describe(e));
        }
    }

    // -- MqttCallbackExtended: Paho's threads ---------------------------------------------------

    @Override
    public void connectionLost(Throwable cause) {
        out.connectionLost(Failure.describe(cause));
    }

    /**
     * Acknowledges the message (queues its PUBACK / PUBCOMP for Paho's sender), then writes the
     * event, under the lock close takes first: so every message the test has seen is acknowledged
     * before close drops the connection (close lets the sender finish). Paho's own acks would come
     * from its callback thread after this returns, racing a close sent right after the event, and
     * the server would deliver the message again.
     */
    @Override
    public void messageArrived(String topic, MqttMessage message) {
        synchronized (deliveries) {
            if (closing) {
                return; // not acknowledged: the server keeps it for the session
            }
            try {
                client.messageArrivedComplete(message.getId(), message.getQos());
            } catch (MqttException e) {
                System.err.println("acknowledging a message: " + Failure.describe(e));
            }
            out.message(topic, message.getPayload(), message.getQos(), message.isRetained(), null);
        }
    }

    @Override
    public void deliveryComplete(IMqttDeliveryToken token) {
        // The publish command's own token reports completion.
    }

    @Override
    public void connectComplete(boolean reconnect, String serverUri) {
        if (reconnect) {
            out.reconnected(client.sessionPresent);
        }
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
        public IMqttToken connect(MqttConnectOptions options, Object context, IMqttActionListener listener)
                throws MqttException {
            return super.connect(options, context, new IMqttActionListener() {
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
    private static final class Completion extends CompletableFuture<IMqttToken> implements IMqttActionListener {
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
