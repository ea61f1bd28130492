package mqttbridge.interop.paho;

import com.google.gson.Gson;
import com.google.gson.GsonBuilder;
import com.google.gson.JsonObject;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;

/**
 * The driver's stdout: one JSON object per line. Results come from the command loop and events
 * from Paho's threads, so every line is written whole under one lock and flushed at once.
 */
final class Output {
    private final Gson gson = new GsonBuilder().disableHtmlEscaping().serializeNulls().create();
    private final PrintStream stdout;

    Output(PrintStream stdout) {
        this.stdout = stdout;
    }

    /** {"id": N, "ok": true, ...fields}. */
    void ok(Long id, JsonObject fields) {
        JsonObject line = new JsonObject();
        line.addProperty("id", id);
        line.addProperty("ok", true);
        fields.entrySet().forEach(field -> line.add(field.getKey(), field.getValue()));
        write(line);
    }

    /** {"id": N, "ok": false, "error": text}; the id is null when the command had none. */
    void failed(Long id, String error) {
        JsonObject line = new JsonObject();
        line.addProperty("id", id);
        line.addProperty("ok", false);
        line.addProperty("error", error);
        write(line);
    }

    /** {"event": name, ...fields}. */
    private void event(String name, JsonObject fields) {
        JsonObject line = new JsonObject();
        line.addProperty("event", name);
        fields.entrySet().forEach(field -> line.add(field.getKey(), field.getValue()));
        write(line);
    }

    /** A message delivered to the client; properties null for MQTT 3.1.1. */
    void message(String topic, byte[] payload, int qos, boolean retain, JsonObject properties) {
        JsonObject fields = new JsonObject();
        fields.addProperty("topic", topic);
        fields.addProperty("payload", new String(payload, StandardCharsets.UTF_8));
        fields.addProperty("qos", qos);
        fields.addProperty("retain", retain);
        if (properties != null) {
            fields.add("properties", properties);
        }
        event("message", fields);
    }

    void connectionLost(String error) {
        JsonObject fields = new JsonObject();
        fields.addProperty("error", error);
        event("connection_lost", fields);
    }

    void reconnected(boolean sessionPresent) {
        JsonObject fields = new JsonObject();
        fields.addProperty("session_present", sessionPresent);
        event("reconnected", fields);
    }

    private synchronized void write(JsonObject line) {
        stdout.print(gson.toJson(line) + "\n");
        stdout.flush();
    }
}
