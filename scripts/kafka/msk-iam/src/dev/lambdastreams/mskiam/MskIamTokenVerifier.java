package dev.lambdastreams.mskiam;

import java.net.URI;
import java.net.URISyntaxException;
import java.nio.charset.StandardCharsets;
import java.security.GeneralSecurityException;
import java.security.MessageDigest;
import java.time.Instant;
import java.time.LocalDateTime;
import java.time.ZoneOffset;
import java.time.format.DateTimeFormatter;
import java.time.format.DateTimeParseException;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;

/**
 * Checks an MSK IAM authentication token (the SASL/OAUTHBEARER token of the AWS_MSK_IAM
 * scheme) against one key pair, written from AWS's Signature Version 4 specification for
 * query-string (presigned URL) authentication, not from any signer's code.
 *
 * <p>A token is the base64url encoding (padding optional) of a URL
 * {@code https://kafka.<region>.amazonaws.com/?Action=kafka-cluster%3AConnect&X-Amz-Algorithm=...}
 * presigned for {@code GET} with SigV4: service {@code kafka-cluster}, {@code host} as the only
 * signed header, the hash of an empty payload, and a {@code User-Agent} parameter appended after
 * signing (so not signed). The canonical request is rebuilt from the URL as SigV4 defines it
 * (every parameter but {@code X-Amz-Signature} and the unsigned {@code User-Agent}, names and
 * values URI-encoded, sorted) and the signature recomputed with the configured secret key.
 *
 * <p>This proves what a client signs, not AWS's own authorizer: IAM policies, STS session
 * tokens and the real MSK endpoint are out of its reach. A session token, when configured, must
 * be the one signed into the URL.
 */
public final class MskIamTokenVerifier {
    /** The action an MSK IAM token must name. */
    public static final String ACTION = "kafka-cluster:Connect";
    /** The SigV4 service name of MSK IAM. */
    public static final String SERVICE = "kafka-cluster";
    private static final String ALGORITHM = "AWS4-HMAC-SHA256";
    /** SigV4's longest presigned URL lifetime (7 days). */
    private static final long MAX_EXPIRES_SECONDS = 604_800;
    private static final DateTimeFormatter AMZ_DATE =
            DateTimeFormatter.ofPattern("yyyyMMdd'T'HHmmss'Z'");
    private static final String EMPTY_PAYLOAD_SHA256 =
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    private final String accessKeyId;
    private final byte[] secretAccessKey;
    private final String sessionToken;
    private final String region;
    private final long clockSkewSeconds;

    /**
     * A verifier for one key pair.
     *
     * @param accessKeyId the access key id tokens must be signed with (the principal)
     * @param secretAccessKey its secret key
     * @param sessionToken the session token the URL must carry, or null if it must carry none
     * @param region the region of the cluster ({@code kafka.<region>.amazonaws.com}, scope)
     * @param clockSkewSeconds how far in the future a token's X-Amz-Date may be
     */
    public MskIamTokenVerifier(
            String accessKeyId,
            String secretAccessKey,
            String sessionToken,
            String region,
            long clockSkewSeconds) {
        this.accessKeyId = Objects.requireNonNull(accessKeyId, "accessKeyId");
        this.secretAccessKey =
                Objects.requireNonNull(secretAccessKey, "secretAccessKey").getBytes(StandardCharsets.UTF_8);
        this.sessionToken = sessionToken;
        this.region = Objects.requireNonNull(region, "region");
        this.clockSkewSeconds = clockSkewSeconds;
    }

    /** Why a token was rejected. */
    public static final class Rejected extends Exception {
        private static final long serialVersionUID = 1L;

        Rejected(String reason) {
            super(reason);
        }
    }

    /** An accepted token: who signed it and when it was signed and expires. */
    public record Verified(String principal, long signedAtMs, long expiresAtMs) {}

    /**
     * Verifies {@code token} at {@code now}.
     *
     * @return the principal (the access key id) and the token's lifetime
     * @throws Rejected with the reason when the token is not valid
     */
    public Verified verify(String token, Instant now) throws Rejected {
        String url;
        try {
            url = new String(Base64.getUrlDecoder().decode(token), StandardCharsets.UTF_8);
        } catch (IllegalArgumentException e) {
            throw new Rejected("the token is not base64url: " + e.getMessage());
        }
        URI uri;
        try {
            uri = new URI(url);
        } catch (URISyntaxException e) {
            throw new Rejected("the token is not a URL: " + e.getMessage());
        }
        String host = "kafka." + region + ".amazonaws.com";
        if (!"https".equals(uri.getScheme())
                || !host.equals(uri.getRawAuthority())
                || !"/".equals(uri.getRawPath())
                || uri.getRawFragment() != null
                || uri.getRawQuery() == null) {
            throw new Rejected("the URL is not https://" + host + "/?...: " + redact(url));
        }
        Map<String, String> params = parseQuery(uri.getRawQuery());

        require(params, "Action", ACTION);
        require(params, "X-Amz-Algorithm", ALGORITHM);
        require(params, "X-Amz-SignedHeaders", "host");

        String credential = get(params, "X-Amz-Credential");
        String[] scope = credential.split("/", -1);
        if (scope.length != 5) {
            throw new Rejected("X-Amz-Credential is not <key>/<date>/<region>/<service>/aws4_request: " + credential);
        }
        if (!accessKeyId.equals(scope[0])) {
            throw new Rejected("unknown access key id " + scope[0]);
        }
        if (!region.equals(scope[2])) {
            throw new Rejected("credential scope region " + scope[2] + " is not " + region);
        }
        if (!SERVICE.equals(scope[3])) {
            throw new Rejected("credential scope service " + scope[3] + " is not " + SERVICE);
        }
        if (!"aws4_request".equals(scope[4])) {
            throw new Rejected("credential scope does not end with aws4_request: " + credential);
        }

        String amzDate = get(params, "X-Amz-Date");
        Instant signedAt;
        try {
            signedAt = LocalDateTime.parse(amzDate, AMZ_DATE).toInstant(ZoneOffset.UTC);
        } catch (DateTimeParseException e) {
            throw new Rejected("X-Amz-Date " + amzDate + " is not yyyyMMddTHHmmssZ");
        }
        if (!amzDate.startsWith(scope[1]) || scope[1].length() != 8) {
            throw new Rejected("credential scope date " + scope[1] + " is not the day of X-Amz-Date " + amzDate);
        }
        long expires;
        try {
            expires = Long.parseLong(get(params, "X-Amz-Expires"));
        } catch (NumberFormatException e) {
            throw new Rejected("X-Amz-Expires is not a number of seconds");
        }
        if (expires < 1 || expires > MAX_EXPIRES_SECONDS) {
            throw new Rejected("X-Amz-Expires " + expires + " is not within 1.." + MAX_EXPIRES_SECONDS);
        }
        if (signedAt.isAfter(now.plusSeconds(clockSkewSeconds))) {
            throw new Rejected("X-Amz-Date " + amzDate + " is in the future (now " + now + ")");
        }
        Instant expiresAt = signedAt.plusSeconds(expires);
        if (!now.isBefore(expiresAt)) {
            throw new Rejected("the token expired at " + expiresAt + " (now " + now + ")");
        }

        String givenSessionToken = params.get("X-Amz-Security-Token");
        if (sessionToken == null && givenSessionToken != null) {
            throw new Rejected("X-Amz-Security-Token given, but access key " + accessKeyId + " has no session");
        }
        if (sessionToken != null && !sessionToken.equals(givenSessionToken)) {
            throw new Rejected(givenSessionToken == null
                    ? "X-Amz-Security-Token missing for access key " + accessKeyId
                    : "X-Amz-Security-Token is not the session of access key " + accessKeyId);
        }

        String signature = get(params, "X-Amz-Signature");
        String expected = signature(params, host, amzDate, scope[1]);
        if (!MessageDigest.isEqual(
                expected.getBytes(StandardCharsets.US_ASCII), signature.getBytes(StandardCharsets.US_ASCII))) {
            throw new Rejected("signature mismatch for access key " + accessKeyId
                    + " (a wrong secret key, or a URL altered after signing)");
        }
        return new Verified(accessKeyId, signedAt.toEpochMilli(), expiresAt.toEpochMilli());
    }

    /** SigV4: canonical request, string to sign, derived key, HMAC. */
    private String signature(Map<String, String> params, String host, String amzDate, String day) {
        List<String[]> signed = new ArrayList<>();
        for (Map.Entry<String, String> p : params.entrySet()) {
            String name = p.getKey();
            if (name.equals("X-Amz-Signature") || name.equals("User-Agent")) {
                continue;
            }
            signed.add(new String[] {uriEncode(name), uriEncode(p.getValue())});
        }
        signed.sort((a, b) -> {
            int byName = a[0].compareTo(b[0]);
            return byName != 0 ? byName : a[1].compareTo(b[1]);
        });
        StringBuilder query = new StringBuilder();
        for (String[] p : signed) {
            if (query.length() > 0) {
                query.append('&');
            }
            query.append(p[0]).append('=').append(p[1]);
        }
        String canonicalRequest = String.join("\n",
                "GET",
                "/",
                query.toString(),
                "host:" + host,
                "",
                "host",
                EMPTY_PAYLOAD_SHA256);
        String scope = day + "/" + region + "/" + SERVICE + "/aws4_request";
        String stringToSign = String.join("\n", ALGORITHM, amzDate, scope, sha256Hex(canonicalRequest));
        byte[] key = hmac(concat("AWS4".getBytes(StandardCharsets.UTF_8), secretAccessKey), day);
        key = hmac(key, region);
        key = hmac(key, SERVICE);
        key = hmac(key, "aws4_request");
        return HexFormat.of().formatHex(hmac(key, stringToSign));
    }

    /** The query's parameters, percent-decoded ({@code +} is a plus); a repeated name is an error. */
    private static Map<String, String> parseQuery(String rawQuery) throws Rejected {
        Map<String, String> params = new LinkedHashMap<>();
        for (String pair : rawQuery.split("&", -1)) {
            int eq = pair.indexOf('=');
            if (eq <= 0) {
                throw new Rejected("malformed query parameter '" + pair + "'");
            }
            String name = percentDecode(pair.substring(0, eq));
            String value = percentDecode(pair.substring(eq + 1));
            if (params.put(name, value) != null) {
                throw new Rejected("query parameter " + name + " given twice");
            }
        }
        return params;
    }

    private static String percentDecode(String s) throws Rejected {
        byte[] out = new byte[s.length()];
        int n = 0;
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (c == '%') {
                if (i + 2 >= s.length()) {
                    throw new Rejected("truncated percent-encoding in '" + s + "'");
                }
                try {
                    out[n++] = (byte) Integer.parseInt(s.substring(i + 1, i + 3), 16);
                } catch (NumberFormatException e) {
                    throw new Rejected("bad percent-encoding in '" + s + "'");
                }
                i += 2;
            } else if (c < 0x80) {
                out[n++] = (byte) c;
            } else {
                throw new Rejected("non-ASCII character in the URL");
            }
        }
        return new String(out, 0, n, StandardCharsets.UTF_8);
    }

    /** SigV4's URI encoding: every byte but {@code A-Za-z0-9-_.~} as %XX (upper-case hex). */
    static String uriEncode(String s) {
        StringBuilder out = new StringBuilder();
        for (byte b : s.getBytes(StandardCharsets.UTF_8)) {
            int c = b & 0xff;
            if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')
                    || c == '-' || c == '_' || c == '.' || c == '~') {
                out.append((char) c);
            } else {
                out.append('%').append(Character.toUpperCase(Character.forDigit(c >> 4, 16)))
                        .append(Character.toUpperCase(Character.forDigit(c & 0xf, 16)));
            }
        }
        return out.toString();
    }

    private static void require(Map<String, String> params, String name, String expected) throws Rejected {
        String value = get(params, name);
        if (!expected.equals(value)) {
            throw new Rejected(name + " is " + value + ", not " + expected);
        }
    }

    private static String get(Map<String, String> params, String name) throws Rejected {
        String value = params.get(name);
        if (value == null) {
            throw new Rejected("query parameter " + name + " missing");
        }
        return value;
    }

    /** The URL without its signature and session token, for messages. */
    private static String redact(String url) {
        return url.replaceAll("(X-Amz-Signature|X-Amz-Security-Token)=[^&]*", "$1=<redacted>");
    }

    private static String sha256Hex(String s) {
        try {
            return HexFormat.of().formatHex(
                    MessageDigest.getInstance("SHA-256").digest(s.getBytes(StandardCharsets.UTF_8)));
        } catch (GeneralSecurityException e) {
            throw new IllegalStateException(e);
        }
    }

    private static byte[] hmac(byte[] key, String data) {
        try {
            Mac mac = Mac.getInstance("HmacSHA256");
            mac.init(new SecretKeySpec(key, "HmacSHA256"));
            return mac.doFinal(data.getBytes(StandardCharsets.UTF_8));
        } catch (GeneralSecurityException e) {
            throw new IllegalStateException(e);
        }
    }

    private static byte[] concat(byte[] a, byte[] b) {
        byte[] out = new byte[a.length + b.length];
        System.arraycopy(a, 0, out, 0, a.length);
        System.arraycopy(b, 0, out, a.length, b.length);
        return out;
    }
}
