package mqttbridge.interop.paho;

import java.util.concurrent.CompletionException;
import java.util.concurrent.ExecutionException;

/** The text of an error for a result or a connection_lost event. */
final class Failure {
    /** An error whose message is the whole error text. */
    static final class Plain extends RuntimeException {
        private static final long serialVersionUID = 1L;

        Plain(String message) {
            super(message);
        }
    }

    private Failure() {}

    static String describe(Throwable error) {
        while ((error instanceof ExecutionException || error instanceof CompletionException)
                && error.getCause() != null) {
            error = error.getCause();
        }
        if (error instanceof Fields.BadField || error instanceof Plain) {
            return error.getMessage();
        }
        // Paho's exceptions print as "message (reason code) - cause"; others need their type.
        String name = error.getClass().getName();
        if (name.startsWith("org.eclipse.paho.")) {
            return error.toString();
        }
        return error.getMessage() == null ? name : name + ": " + error.getMessage();
    }
}
