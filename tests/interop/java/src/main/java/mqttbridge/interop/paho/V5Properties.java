package mqttbridge.interop.paho;

import com.google.gson.JsonArray;
import com.google.gson.JsonObject;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Locale;
import org.eclipse.paho.mqttv5.common.packet.MqttProperties;
import org.eclipse.paho.mqttv5.common.packet.UserProperty;

/** The protocol's "properties" object and Paho's MqttProperties of a PUBLISH, both ways. */
final class V5Properties {
    private static final HexFormat HEX = HexFormat.of();

    private V5Properties() {}

    /** The properties of a publish command; an unknown key or a bad value is a BadField. */
    static MqttProperties toPaho(Fields fields) {
        MqttProperties properties = new MqttProperties();
        for (String name : fields.names()) {
            if (fields.has(name)) {
                set(properties, fields, name);
            }
        }
        return properties;
    }

    private static void set(MqttProperties properties, Fields fields, String name) {
        switch (name) {
            case "user_properties" -> properties.setUserProperties(userProperties(fields.stringPairs(name)));
            case "response_topic" -> properties.setResponseTopic(fields.string(name));
            case "correlation_data" -> properties.setCorrelationData(hex(fields, name));
            case "content_type" -> properties.setContentType(fields.string(name));
            // Paho keeps the indicator as a boolean and writes it only when true: 0 and absent
            // are the same on the wire (and mean the same, MQTT 5.0 3.3.2.3.2).
            case "payload_format" -> properties.setPayloadFormat(fields.integer(name, 0, 1) == 1);
            case "message_expiry" -> properties.setMessageExpiryInterval(fields.integer(name, 0, 0xFFFFFFFFL));
            // See V5Client.publish: Paho replaces this with an alias of its own choosing.
            case "topic_alias" -> properties.setTopicAlias((int) fields.integer(name, 1, 65535));
            default -> throw new Fields.BadField("unknown property '" + name + "'");
        }
    }

    private static List<UserProperty> userProperties(String[][] pairs) {
        List<UserProperty> list = new ArrayList<>();
        for (String[] pair : pairs) {
            list.add(new UserProperty(pair[0], pair[1]));
        }
        return list;
    }

    private static byte[] hex(Fields fields, String name) {
        String text = fields.string(name);
        if (!text.equals(text.toLowerCase(Locale.ROOT))) {
            throw fields.bad(name, "lower-case hex");
        }
        try {
            return HEX.parseHex(text);
        } catch (IllegalArgumentException e) {
            throw fields.bad(name, "lower-case hex");
        }
    }

    /** The properties of a received PUBLISH, as Paho decoded them; keys it did not carry left out. */
    static JsonObject toJson(MqttProperties properties) {
        JsonObject json = new JsonObject();
        if (!properties.getUserProperties().isEmpty()) {
            JsonArray pairs = new JsonArray();
            for (UserProperty property : properties.getUserProperties()) {
                JsonArray pair = new JsonArray();
                pair.add(property.getKey());
                pair.add(property.getValue());
                pairs.add(pair);
            }
            json.add("user_properties", pairs);
        }
        if (properties.getResponseTopic() != null) {
            json.addProperty("response_topic", properties.getResponseTopic());
        }
        if (properties.getCorrelationData() != null) {
            json.addProperty("correlation_data", HEX.formatHex(properties.getCorrelationData()));
        }
        if (properties.getContentType() != null) {
            json.addProperty("content_type", properties.getContentType());
        }
        // Paho decodes the indicator to a boolean defaulting to false: a 0 sent cannot be told
        // from none, so only a 1 is reported.
        if (properties.getPayloadFormat()) {
            json.addProperty("payload_format", 1);
        }
        if (properties.getMessageExpiryInterval() != null) {
            json.addProperty("message_expiry", properties.getMessageExpiryInterval());
        }
        if (properties.getTopicAlias() != null) {
            json.addProperty("topic_alias", properties.getTopicAlias());
        }
        if (!properties.getSubscriptionIdentifiers().isEmpty()) {
            JsonArray ids = new JsonArray();
            properties.getSubscriptionIdentifiers().forEach(ids::add);
            json.add("subscription_ids", ids);
        }
        return json;
    }
}
