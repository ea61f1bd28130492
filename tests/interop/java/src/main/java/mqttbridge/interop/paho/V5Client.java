package mqttbridge.interop.paho;

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
final class V5Client extends PahoClient<V5Client.Options, V5Client.Paho> implements MqttCallback {
    /**
     * The server's topic aliases (see messageArrived), used under deliver's lock. Not cleared at a
     * reconnect: a server defines an alias on each connection (topic and alias) before it sends
     * it alone, so a mapping from an earlier connection is replaced before it could be read.
     */
    private final Map<Integer, String> serverAliases = new HashMap<>();

    V5Client(ConnectParams params, Output out) throws MqttException {
        super("mqttv5", new Options(), new Paho(params), params, out);
        client.setCallback(this);
        options.setCleanStart(params.clean());
        if (params.sessionExpiry() > 0) {
            options.setSessionExpiryInterval(params.sessionExpiry());
        }
        if (params.topicAliasMaximum() > 0) {
            options.setTopicAliasMaximum(params.topicAliasMaximum());
        }
        if (params.password() != null) {
            options.setPassword(params.password().getBytes(StandardCharsets.UTF_8));
        }
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
        return done.thenApply(PahoClient::granted);
    }

    @Override
    public CompletableFuture<JsonObject> unsubscribe(String filter) throws MqttException {
        Completion done = new Completion();
        client.unsubscribe(new String[] {filter}, null, done, new MqttProperties());
        return done.thenApply(reply -> new JsonObject());
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
        return done.thenApply(reply -> {
            refuseFailedAcks(qos, reply.codes());
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
     * Acknowledged (see Paho.acknowledge) and written by deliver.
     *
     * <p>Paho 1.2.5 resolves the server's topic aliases wrongly (eclipse-paho/paho.mqtt.java#866:
     * the empty topic of a PUBLISH sent with an alias alone is taken for a new mapping), so such
     * a message reaches its callback with topic "". What a Java application on 1.2.5 has to do,
     * the driver does: it keeps the server's mappings of this connection itself (serverAliases).
     */
    @Override
    public void messageArrived(String topic, MqttMessage message) {
        MqttProperties properties = message.getProperties();
        deliver(message.getId(), message.getQos(), () -> out.message(resolveAlias(topic, properties),
                message.getPayload(), message.getQos(), message.isRetained(), V5Properties.toJson(properties)));
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
    public void authPacketArrived(int reasonCode, MqttProperties properties) {
        System.err.println("mqttv5 client: unexpected AUTH, reason code " + reasonCode);
    }

    /** Paho's client (see PahoClient.AsyncClient). */
    static final class Paho extends MqttAsyncClient implements AsyncClient<MqttConnectionOptions, MqttActionListener> {
        Paho(ConnectParams params) throws MqttException {
            super(params.serverUri(), params.clientId(), new MemoryPersistence());
        }

        /**
         * A QoS 1 message's PUBACK. QoS 2 needs nothing: Paho 1.2.5 sends PUBREC on receipt and
         * PUBCOMP on PUBREL whatever the ack mode (a manual ack would add a PUBCOMP).
         */
        @Override
        public void acknowledge(int messageId, int qos) throws MqttException {
            if (qos == 1) {
                messageArrivedComplete(messageId, 1);
            }
        }

        /** Every connect, the automatic reconnect's included: see PahoClient.trackSession. */
        @Override
        public IMqttToken connect(MqttConnectionOptions options, Object context, MqttActionListener listener)
                throws MqttException {
            return super.connect(options, context, trackSession(context, new Completion(listener)));
        }
    }

    /** Paho's connect options (see PahoClient.ConnectOptions). */
    static final class Options extends MqttConnectionOptions implements ConnectOptions {}
}
