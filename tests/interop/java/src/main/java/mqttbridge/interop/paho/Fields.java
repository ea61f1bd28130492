package mqttbridge.interop.paho;

import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonPrimitive;
import java.math.BigDecimal;
import java.util.Set;

/**
 * Typed access to the fields of a command (or of its "properties"): a missing or mistyped field
 * is a {@link BadField} naming it, which the driver answers with ok: false.
 */
final class Fields {
    /** A field that is missing, of the wrong type or out of range. */
    static final class BadField extends IllegalArgumentException {
        private static final long serialVersionUID = 1L;

        BadField(String message) {
            super(message);
        }
    }

    private final JsonObject json;
    private final String prefix;

    Fields(JsonObject json) {
        this(json, "");
    }

    private Fields(JsonObject json, String prefix) {
        this.json = json;
        this.prefix = prefix;
    }

    Set<String> names() {
        return json.keySet();
    }

    boolean has(String name) {
        return json.has(name) && !json.get(name).isJsonNull();
    }

    String string(String name) {
        JsonElement value = required(name);
        if (!value.isJsonPrimitive() || !value.getAsJsonPrimitive().isString()) {
            throw bad(name, "a string");
        }
        return value.getAsString();
    }

    /** The string, or null when the field is absent or null. */
    String optionalString(String name) {
        return has(name) ? string(name) : null;
    }

    long integer(String name, long min, long max) {
        JsonElement value = required(name);
        String expected = "an integer in " + min + ".." + max;
        if (!value.isJsonPrimitive() || !value.getAsJsonPrimitive().isNumber()) {
            throw bad(name, expected);
        }
        BigDecimal number = value.getAsBigDecimal();
        if (number.stripTrailingZeros().scale() > 0
                || number.compareTo(BigDecimal.valueOf(min)) < 0
                || number.compareTo(BigDecimal.valueOf(max)) > 0) {
            throw bad(name, expected);
        }
        return number.longValue();
    }

    long integer(String name, long min, long max, long absent) {
        return has(name) ? integer(name, min, max) : absent;
    }

    boolean bool(String name, boolean absent) {
        if (!has(name)) {
            return absent;
        }
        JsonElement value = json.get(name);
        if (!value.isJsonPrimitive() || !value.getAsJsonPrimitive().isBoolean()) {
            throw bad(name, "true or false");
        }
        return value.getAsBoolean();
    }

    /** A nested object ("properties"), empty when absent or null. */
    Fields object(String name) {
        if (!has(name)) {
            return new Fields(new JsonObject(), prefix + name + ".");
        }
        JsonElement value = json.get(name);
        if (!value.isJsonObject()) {
            throw bad(name, "an object");
        }
        return new Fields(value.getAsJsonObject(), prefix + name + ".");
    }

    /** A list of [string, string] pairs (user_properties). */
    String[][] stringPairs(String name) {
        JsonElement value = required(name);
        String expected = "a list of [key, value] string pairs";
        if (!value.isJsonArray()) {
            throw bad(name, expected);
        }
        JsonArray list = value.getAsJsonArray();
        String[][] pairs = new String[list.size()][];
        for (int i = 0; i < list.size(); i++) {
            pairs[i] = stringPair(list.get(i), name, expected);
        }
        return pairs;
    }

    BadField bad(String name, String expected) {
        return new BadField("field '" + prefix + name + "' must be " + expected);
    }

    private String[] stringPair(JsonElement element, String name, String expected) {
        if (!element.isJsonArray() || element.getAsJsonArray().size() != 2) {
            throw bad(name, expected);
        }
        String[] pair = new String[2];
        for (int i = 0; i < 2; i++) {
            JsonElement item = element.getAsJsonArray().get(i);
            if (!(item instanceof JsonPrimitive) || !item.getAsJsonPrimitive().isString()) {
                throw bad(name, expected);
            }
            pair[i] = item.getAsString();
        }
        return pair;
    }

    private JsonElement required(String name) {
        if (!has(name)) {
            throw new BadField("missing field '" + prefix + name + "'");
        }
        return json.get(name);
    }
}
