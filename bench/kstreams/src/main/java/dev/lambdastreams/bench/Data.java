package dev.lambdastreams.bench;

/**
 * The benchmark's input, shared by the producer, the verifier and (in spirit) the Rust side
 * ({@code bench/topologies}): record {@code i} of {@code n} has the key {@code "key-" + (i % keys)}
 * and the UTF-8 value {@code "<i>,<amount>"}, where {@code amount} is a hash of {@code i}
 * modulo 100. The stateless pipeline keeps records with {@code amount >= 50} (about half)
 * and maps each to {@code (key, key + ":" + amount * 2)}.
 */
final class Data {
    private Data() {}

    static String key(long i, int keys) {
        return "key-" + (i % keys);
    }

    /** A hash of i in 0..100 (splitmix64's finalizer, then modulo). */
    static int amount(long i) {
        long z = i + 0x9E3779B97F4A7C15L;
        z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9L;
        z = (z ^ (z >>> 27)) * 0x94D049BB133111EBL;
        z = z ^ (z >>> 31);
        return (int) Long.remainderUnsigned(z, 100);
    }

    static String value(long i) {
        return i + "," + amount(i);
    }

    /** The amount of a value, or -1 when it has none. */
    static int parseAmount(String value) {
        int comma = value.indexOf(',');
        if (comma < 0) {
            return -1;
        }
        try {
            return Integer.parseInt(value, comma + 1, value.length(), 10);
        } catch (NumberFormatException e) {
            return -1;
        }
    }

    static boolean keep(String value) {
        return parseAmount(value) >= 50;
    }

    static String mapped(String key, String value) {
        return key + ":" + parseAmount(value) * 2;
    }
}
