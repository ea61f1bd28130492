package mqttbridge.interop.paho;

import com.google.gson.JsonObject;
import java.util.concurrent.CompletableFuture;

/**
 * One connection of a Paho client (mqttv3 or mqttv5), turning the protocol's commands into
 * library calls. Each future completes with the result's fields once the library reports the
 * operation done, or fails with the library's error; a call may also throw at once (a bad field,
 * a call the library refuses).
 */
interface Client {
    /** Result: session_present, once CONNACK accepted the connection. */
    CompletableFuture<JsonObject> connect() throws Exception;

    /** Result: granted, the SUBACK's return / reason codes. */
    CompletableFuture<JsonObject> subscribe(String filter, int qos, Long subscriptionId) throws Exception;

    CompletableFuture<JsonObject> unsubscribe(String filter) throws Exception;

    /** Completes once the publish is done for its QoS; properties are the command's (5.0 only). */
    CompletableFuture<JsonObject> publish(String topic, byte[] payload, int qos, boolean retain,
            Fields properties) throws Exception;

    /** A normal DISCONNECT, then the connection is closed and the client released. */
    CompletableFuture<JsonObject> disconnect() throws Exception;

    /**
     * Drops the network connection without DISCONNECT, stops the automatic reconnect and
     * releases the client. Does nothing once the client is released.
     */
    CompletableFuture<JsonObject> close() throws Exception;
}
