package mqttbridge.interop.paho;

/** The fields of a connect command (tests/interop/README.md), checked. */
record ConnectParams(
        String serverUri,
        String clientId,
        boolean clean,
        int keepalive,
        boolean reconnect,
        long sessionExpiry,
        int topicAliasMaximum,
        String username,
        String password,
        int connectTimeoutSeconds) {

    /** The longest wait between two retries of Paho's automatic reconnect. */
    static final int RECONNECT_DELAY_MS = 1000;
    /**
     * How long a close lets Paho's sender write what is queued before it drops the connection:
     * the acknowledgements of messages already reported (see PahoClient.deliver), so the
     * server does not deliver them again. Paho takes no new messages meanwhile, and waits for
     * nothing when nothing is queued.
     */
    static final long CLOSE_QUIESCE_MS = 1000;

    static ConnectParams from(Fields cmd, int version, long timeoutMs) {
        ConnectParams params = new ConnectParams(
                serverUri(cmd),
                cmd.string("client_id"),
                cmd.bool("clean", true),
                (int) cmd.integer("keepalive", 0, 65535, 30),
                cmd.bool("reconnect", false),
                cmd.integer("session_expiry", 0, 0xFFFFFFFFL, 0),
                (int) cmd.integer("topic_alias_maximum", 0, 65535, 0),
                cmd.optionalString("username"),
                cmd.optionalString("password"),
                // Paho gives up on a connect attempt when the command would time out.
                (int) Math.max(1, (timeoutMs + 999) / 1000));
        if (version == 4 && (params.sessionExpiry() > 0 || params.topicAliasMaximum() > 0)) {
            throw new Fields.BadField("session_expiry and topic_alias_maximum are MQTT 5.0 only (version 5)");
        }
        return params;
    }

    /** Paho's spelling of the url: tcp:// for mqtt://; ws:// as it is. */
    private static String serverUri(Fields cmd) {
        String url = cmd.string("url");
        if (url.startsWith("mqtt://")) {
            return "tcp://" + url.substring("mqtt://".length());
        }
        if (url.startsWith("ws://")) {
            return url;
        }
        throw cmd.bad("url", "mqtt://HOST:PORT or ws://HOST:PORT/PATH");
    }
}
