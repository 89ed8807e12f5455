package dev.lambdastreams.mskiam;

import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.util.Base64;

/**
 * Checks {@link MskIamTokenVerifier} on tokens made by botocore 1.40.76 (the signer of
 * aws-msk-iam-sasl-signer-python; the vectors of framework/src/kafka.rs's tests) before the
 * broker uses it: they verify at their clock, and expired, early, altered or wrongly keyed
 * ones do not. Run by scripts/services after compiling; exits 1 on a failure.
 */
public final class SelfCheck {
    private SelfCheck() {}

    private static final String PLAIN = "aHR0cHM6Ly9rYWZrYS51cy1lYXN0LTEuYW1hem9uYXdzLmNvbS8_QWN0aW9uPWthZmthLWNsdXN0ZXIlM0FDb25uZWN0JlgtQW16LUFsZ29yaXRobT1BV1M0LUhNQUMtU0hBMjU2JlgtQW16LUNyZWRlbnRpYWw9QUtJREVYQU1QTEUlMkYyMDI0MDEwMiUyRnVzLWVhc3QtMSUyRmthZmthLWNsdXN0ZXIlMkZhd3M0X3JlcXVlc3QmWC1BbXotRGF0ZT0yMDI0MDEwMlQwMzA0MDVaJlgtQW16LUV4cGlyZXM9OTAwJlgtQW16LVNpZ25lZEhlYWRlcnM9aG9zdCZYLUFtei1TaWduYXR1cmU9ZDk3NmE2MzMzNGIyZjYwZTY4MmJhNjUwMzJjZDllOTg1Y2M1MjVmOWJlODA5ZGJhNDk1OTg0Zjg2NjkxMDEyNCZVc2VyLUFnZW50PWxhbWJkYS1zdHJlYW1zJTJGdGVzdA";
    private static final String SESSION = "aHR0cHM6Ly9rYWZrYS5ldS13ZXN0LTMuYW1hem9uYXdzLmNvbS8_QWN0aW9uPWthZmthLWNsdXN0ZXIlM0FDb25uZWN0JlgtQW16LUFsZ29yaXRobT1BV1M0LUhNQUMtU0hBMjU2JlgtQW16LUNyZWRlbnRpYWw9QVNJQUVYQU1QTEUlMkYyMDI0MDEwMiUyRmV1LXdlc3QtMyUyRmthZmthLWNsdXN0ZXIlMkZhd3M0X3JlcXVlc3QmWC1BbXotRGF0ZT0yMDI0MDEwMlQwMzA0MDVaJlgtQW16LUV4cGlyZXM9OTAwJlgtQW16LVNpZ25lZEhlYWRlcnM9aG9zdCZYLUFtei1TZWN1cml0eS1Ub2tlbj1JUW9KYjNKcFoybHVYMlZqRVhBTVBMRSUyRiUyQiUzRHRva2VuJlgtQW16LVNpZ25hdHVyZT0zNDE4NWI3MDgyZTM4NjhlN2ZiYTFkODFhN2MzOGQ4YjJlYmJkZmE5ODQ4Y2JmOThmYWI0YjZiOTBlYmRmMGI5JlVzZXItQWdlbnQ9bGFtYmRhLXN0cmVhbXMlMkZ0ZXN0";
    private static final Instant SIGNED_AT = Instant.parse("2024-01-02T03:04:05Z");

    private static int failures = 0;

    public static void main(String[] args) {
        MskIamTokenVerifier plain = new MskIamTokenVerifier(
                "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", null, "us-east-1", 300);
        MskIamTokenVerifier session = new MskIamTokenVerifier(
                "ASIAEXAMPLE", "secret/with+slash=", "IQoJb3JpZ2luX2VjEXAMPLE/+=token", "eu-west-3", 300);
        accepts("botocore token", plain, PLAIN, SIGNED_AT.plusSeconds(10));
        accepts("botocore token with a session token", session, SESSION, SIGNED_AT.plusSeconds(899));
        rejects("expired", plain, PLAIN, SIGNED_AT.plusSeconds(900), "expired");
        rejects("signed in the future", plain, PLAIN, SIGNED_AT.minusSeconds(301), "in the future");
        rejects("wrong secret", new MskIamTokenVerifier(
                "AKIDEXAMPLE", "not-the-secret", null, "us-east-1", 300), PLAIN, SIGNED_AT, "signature mismatch");
        rejects("other access key", new MskIamTokenVerifier(
                "AKIDOTHER", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", null, "us-east-1", 300), PLAIN, SIGNED_AT,
                "unknown access key");
        rejects("other region", new MskIamTokenVerifier(
                "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", null, "eu-west-1", 300), PLAIN, SIGNED_AT,
                "is not https://kafka.eu-west-1.amazonaws.com/");
        rejects("session token not configured", new MskIamTokenVerifier(
                "ASIAEXAMPLE", "secret/with+slash=", null, "eu-west-3", 300), SESSION, SIGNED_AT,
                "X-Amz-Security-Token given");
        rejects("session token missing", new MskIamTokenVerifier(
                "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "t", "us-east-1", 300), PLAIN, SIGNED_AT,
                "X-Amz-Security-Token missing");
        String url = decode(PLAIN);
        rejects("longer lifetime", plain, encode(url.replace("X-Amz-Expires=900", "X-Amz-Expires=3600")), SIGNED_AT,
                "signature mismatch");
        rejects("other action", plain, encode(url.replace("kafka-cluster%3AConnect", "kafka-cluster%3AAlterCluster")),
                SIGNED_AT, "Action is kafka-cluster:AlterCluster");
        rejects("extra signed parameter", plain, encode(url.replace("&User-Agent", "&X-Extra=1&User-Agent")), SIGNED_AT,
                "signature mismatch");
        accepts("other User-Agent (not signed)", plain, encode(url.replace("lambda-streams%2Ftest", "other")),
                SIGNED_AT);
        rejects("not base64url", plain, "not base64!", SIGNED_AT, "not base64url");
        if (failures > 0) {
            System.err.println("MSK IAM validator self-check: " + failures + " failure(s)");
            System.exit(1);
        }
        System.out.println("MSK IAM validator self-check: ok");
    }

    private static String decode(String token) {
        return new String(Base64.getUrlDecoder().decode(token), StandardCharsets.UTF_8);
    }

    private static String encode(String url) {
        return Base64.getUrlEncoder().withoutPadding().encodeToString(url.getBytes(StandardCharsets.UTF_8));
    }

    private static void accepts(String what, MskIamTokenVerifier verifier, String token, Instant now) {
        try {
            verifier.verify(token, now);
        } catch (MskIamTokenVerifier.Rejected e) {
            failures++;
            System.err.println("FAIL " + what + ": rejected: " + e.getMessage());
        }
    }

    private static void rejects(String what, MskIamTokenVerifier verifier, String token, Instant now, String reason) {
        try {
            verifier.verify(token, now);
            failures++;
            System.err.println("FAIL " + what + ": accepted");
        } catch (MskIamTokenVerifier.Rejected e) {
            if (!e.getMessage().contains(reason)) {
                failures++;
                System.err.println("FAIL " + what + ": rejected for '" + e.getMessage() + "', expected '" + reason + "'");
            }
        }
    }
}
