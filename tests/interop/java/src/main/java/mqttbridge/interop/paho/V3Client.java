package mqttbridge.interop.paho;

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
final class V3Client extends PahoClient<V3Client.Options, V3Client.Paho> implements MqttCallbackExtended {
    V3Client(ConnectParams params, Output out) throws MqttException {
        super("mqttv3", new Options(), new Paho(params), params, out);
        client.setCallback(this);
        // Exactly 3.1.1: Paho's default would retry a refused CONNECT as MQTT 3.1.
        options.setMqttVersion(MqttConnectOptions.MQTT_VERSION_3_1_1);
        options.setCleanSession(params.clean());
        if (params.password() != null) {
            options.setPassword(params.password().toCharArray());
        }
    }

    @Override
    public CompletableFuture<JsonObject> subscribe(String filter, int qos, Long subscriptionId) throws MqttException {
        if (subscriptionId != null) {
            throw new Fields.BadField("subscription_id is MQTT 5.0 only (version 5)");
        }
        Completion done = new Completion();
        client.subscribe(filter, qos, null, done);
        return done.thenApply(PahoClient::granted);
    }

    @Override
    public CompletableFuture<JsonObject> unsubscribe(String filter) throws MqttException {
        Completion done = new Completion();
        client.unsubscribe(filter, null, done);
        return done.thenApply(reply -> new JsonObject());
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
        return done.thenApply(reply -> new JsonObject());
    }

    // -- MqttCallbackExtended: Paho's threads ---------------------------------------------------

    @Override
    public void connectionLost(Throwable cause) {
        out.connectionLost(Failure.describe(cause));
    }

    /** Acknowledged (PUBACK / PUBCOMP) and written by deliver. */
    @Override
    public void messageArrived(String topic, MqttMessage message) {
        deliver(message.getId(), message.getQos(),
                () -> out.message(topic, message.getPayload(), message.getQos(), message.isRetained(), null));
    }

    @Override
    public void deliveryComplete(IMqttDeliveryToken token) {
        // The publish command's own token reports completion.
    }

    /** Paho's client (see PahoClient.AsyncClient). */
    static final class Paho extends MqttAsyncClient implements AsyncClient<MqttConnectOptions, IMqttActionListener> {
        Paho(ConnectParams params) throws MqttException {
            super(params.serverUri(), params.clientId(), new MemoryPersistence());
        }

        @Override
        public void acknowledge(int messageId, int qos) throws MqttException {
            messageArrivedComplete(messageId, qos);
        }

        /** Every connect, the automatic reconnect's included: see PahoClient.trackSession. */
        @Override
        public IMqttToken connect(MqttConnectOptions options, Object context, IMqttActionListener listener)
                throws MqttException {
            return super.connect(options, context, trackSession(context, new Completion(listener)));
        }
    }

    /** Paho's connect options (see PahoClient.ConnectOptions). */
    static final class Options extends MqttConnectOptions implements ConnectOptions {}
}
