package dev.lambdastreams.mskiam;

import java.io.IOException;
import java.time.Instant;
import java.util.List;
import java.util.Map;
import java.util.Set;
import javax.security.auth.callback.Callback;
import javax.security.auth.callback.UnsupportedCallbackException;
import javax.security.auth.login.AppConfigurationEntry;
import org.apache.kafka.common.security.auth.AuthenticateCallbackHandler;
import org.apache.kafka.common.security.oauthbearer.OAuthBearerExtensionsValidatorCallback;
import org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule;
import org.apache.kafka.common.security.oauthbearer.OAuthBearerToken;
import org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallback;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A broker-side SASL/OAUTHBEARER validator for MSK IAM tokens (what clients send with
 * {@code AWS_MSK_IAM}), for a local broker in tests: accepts a token signed with the one key
 * pair of the listener's JAAS options, with the access key id as the principal, and rejects
 * anything else with the reason in the broker's log (see {@link MskIamTokenVerifier}).
 *
 * <p>Options of the listener's {@code OAuthBearerLoginModule} JAAS entry:
 * {@code accessKeyId}, {@code secretAccessKey}, {@code region} (required),
 * {@code sessionToken} (optional: then tokens must carry it), {@code clockSkewSeconds}
 * (default 300). Configure it as the listener's
 * {@code oauthbearer.sasl.server.callback.handler.class}.
 */
public final class MskIamValidatorCallbackHandler implements AuthenticateCallbackHandler {
    private static final Logger LOG = LoggerFactory.getLogger(MskIamValidatorCallbackHandler.class);

    private MskIamTokenVerifier verifier;

    /** Made by the broker, then {@link #configure}d. */
    public MskIamValidatorCallbackHandler() {}

    @Override
    public void configure(Map<String, ?> configs, String saslMechanism, List<AppConfigurationEntry> jaasConfigEntries) {
        if (!OAuthBearerLoginModule.OAUTHBEARER_MECHANISM.equals(saslMechanism)) {
            throw new IllegalArgumentException("MskIamValidatorCallbackHandler: mechanism " + saslMechanism + " is not OAUTHBEARER");
        }
        if (jaasConfigEntries == null || jaasConfigEntries.size() != 1) {
            throw new IllegalArgumentException("MskIamValidatorCallbackHandler: expected one JAAS entry (OAuthBearerLoginModule), got "
                    + (jaasConfigEntries == null ? 0 : jaasConfigEntries.size()));
        }
        Map<String, ?> options = jaasConfigEntries.get(0).getOptions();
        String skew = option(options, "clockSkewSeconds", false);
        long clockSkewSeconds;
        try {
            clockSkewSeconds = skew == null ? 300 : Long.parseLong(skew);
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException("MskIamValidatorCallbackHandler: JAAS option clockSkewSeconds=" + skew + " is not a number");
        }
        verifier = new MskIamTokenVerifier(
                option(options, "accessKeyId", true),
                option(options, "secretAccessKey", true),
                option(options, "sessionToken", false),
                option(options, "region", true),
                clockSkewSeconds);
        LOG.info("MSK IAM validator: accepting tokens of access key {} for region {}{}",
                options.get("accessKeyId"), options.get("region"),
                options.get("sessionToken") == null ? "" : " with its session token");
    }

    private static String option(Map<String, ?> options, String name, boolean required) {
        Object value = options.get(name);
        if (value == null || value.toString().isEmpty()) {
            if (required) {
                throw new IllegalArgumentException("MskIamValidatorCallbackHandler: JAAS option " + name + " is required");
            }
            return null;
        }
        return value.toString();
    }

    @Override
    public void handle(Callback[] callbacks) throws IOException, UnsupportedCallbackException {
        if (verifier == null) {
            throw new IllegalStateException("MskIamValidatorCallbackHandler: not configured");
        }
        for (Callback callback : callbacks) {
            if (callback instanceof OAuthBearerValidatorCallback validation) {
                validate(validation);
            } else if (callback instanceof OAuthBearerExtensionsValidatorCallback extensions) {
                // MSK IAM tokens carry no SASL extensions: refuse any, rather than ignore them.
                for (String name : extensions.inputExtensions().map().keySet()) {
                    extensions.error(name, "MSK IAM takes no SASL extensions");
                }
            } else {
                throw new UnsupportedCallbackException(callback);
            }
        }
    }

    private void validate(OAuthBearerValidatorCallback callback) {
        String value = callback.tokenValue();
        try {
            MskIamTokenVerifier.Verified verified = verifier.verify(value, Instant.now());
            callback.token(new Token(value, verified));
            LOG.info("MSK IAM validator: accepted a token of {}", verified.principal());
        } catch (MskIamTokenVerifier.Rejected e) {
            LOG.warn("MSK IAM validator: rejected a token: {}", e.getMessage());
            callback.error("invalid_token", null, null);
        }
    }

    @Override
    public void close() {}

    /** An accepted token. */
    private record Token(String value, MskIamTokenVerifier.Verified verified) implements OAuthBearerToken {
        @Override
        public Set<String> scope() {
            return Set.of(MskIamTokenVerifier.ACTION);
        }

        @Override
        public long lifetimeMs() {
            return verified.expiresAtMs();
        }

        @Override
        public String principalName() {
            return verified.principal();
        }

        @Override
        public Long startTimeMs() {
            return verified.signedAtMs();
        }

        @Override
        public String toString() {
            return "MskIamToken[" + verified.principal() + "]";
        }
    }
}
