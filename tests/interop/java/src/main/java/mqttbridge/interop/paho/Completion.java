package mqttbridge.interop.paho;

import java.util.concurrent.CompletableFuture;
import org.eclipse.paho.client.mqttv3.IMqttActionListener;
import org.eclipse.paho.client.mqttv3.IMqttToken;
import org.eclipse.paho.mqttv5.client.MqttActionListener;

/**
 * A Paho action listener as a future, for either client: mqttv3's IMqttActionListener and
 * mqttv5's MqttActionListener are the same two callbacks over tokens of different types, so one
 * class implements both, and the future holds what the driver reads of a token (a Reply) rather
 * than the token. One made around a listener passes each callback on to it once it has completed
 * (see PahoClient.trackSession).
 */
final class Completion extends CompletableFuture<Completion.Reply>
        implements IMqttActionListener, MqttActionListener {
    /**
     * A completed token: the session present flag of a CONNACK; the codes of a SUBACK (mqttv3: the
     * granted QoS), or of every acknowledgement (mqttv5: its reason codes).
     */
    record Reply(boolean sessionPresent, int[] codes) {}

    /** The listener this one passes the callbacks on to, of mqttv3 or mqttv5 (one at most). */
    private final IMqttActionListener v3Next;
    private final MqttActionListener v5Next;

    Completion() {
        this(null, null);
    }

    Completion(IMqttActionListener next) {
        this(next, null);
    }

    Completion(MqttActionListener next) {
        this(null, next);
    }

    private Completion(IMqttActionListener v3Next, MqttActionListener v5Next) {
        this.v3Next = v3Next;
        this.v5Next = v5Next;
    }

    // -- mqttv3 ----------------------------------------------------------------------------------

    @Override
    public void onSuccess(IMqttToken token) {
        complete(new Reply(token.getSessionPresent(), token.getGrantedQos()));
        if (v3Next != null) {
            v3Next.onSuccess(token);
        }
    }

    @Override
    public void onFailure(IMqttToken token, Throwable error) {
        completeExceptionally(error);
        if (v3Next != null) {
            v3Next.onFailure(token, error);
        }
    }

    // -- mqttv5 ----------------------------------------------------------------------------------

    @Override
    public void onSuccess(org.eclipse.paho.mqttv5.client.IMqttToken token) {
        complete(new Reply(token.getSessionPresent(), token.getReasonCodes()));
        if (v5Next != null) {
            v5Next.onSuccess(token);
        }
    }

    @Override
    public void onFailure(org.eclipse.paho.mqttv5.client.IMqttToken token, Throwable error) {
        completeExceptionally(error);
        if (v5Next != null) {
            v5Next.onFailure(token, error);
        }
    }
}
