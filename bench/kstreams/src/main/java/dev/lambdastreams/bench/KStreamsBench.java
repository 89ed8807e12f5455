package dev.lambdastreams.bench;

import java.io.File;
import java.time.Duration;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Produced;

/**
 * The Kafka Streams side of the end-to-end benchmark.
 *
 * <pre>
 * java -jar kstreams-bench.jar BOOTSTRAP APP_ID INPUT OUTPUT stateless|count at_least_once|exactly_once_v2 EXPECTED [STATE_DIR]
 * </pre>
 *
 * Runs the topology until a {@code peek} at the source has seen EXPECTED input records,
 * then closes the application (which commits, flushes caches and the producer), and prints
 * one JSON line: records seen, seconds from the first record to the end of {@code close()},
 * and from the process start. Exits 2 if no record arrives for 120 s.
 *
 * <p>Configuration: num.stream.threads = 2 (two cores), the state directory under
 * target/tmp, everything else Kafka Streams' defaults: commit.interval.ms 30000 with
 * at_least_once and 100 with exactly_once_v2, statestore.cache.max.bytes 10 MB (the count's
 * updates are deduplicated in the cache between commits), RocksDB for the count's store.
 */
public final class KStreamsBench {
    private KStreamsBench() {}

    public static void main(String[] args) throws Exception {
        long startNanos = System.nanoTime();
        if (args.length < 7) {
            System.err.println("usage: BOOTSTRAP APP_ID INPUT OUTPUT stateless|count at_least_once|exactly_once_v2 EXPECTED [STATE_DIR]");
            System.exit(64);
        }
        String bootstrap = args[0], appId = args[1], input = args[2], output = args[3];
        String mode = args[4], guarantee = args[5];
        long expected = Long.parseLong(args[6]);
        String stateDir = args.length > 7 ? args[7] : "target/tmp";

        Properties props = new Properties();
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, guarantee);
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 2);
        props.put(StreamsConfig.STATE_DIR_CONFIG, new File(stateDir).getAbsolutePath());
        props.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        props.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
        props.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");

        AtomicLong seen = new AtomicLong();
        AtomicLong firstNanos = new AtomicLong();
        AtomicLong lastNanos = new AtomicLong();
        StreamsBuilder builder = new StreamsBuilder();
        KStream<String, String> source = builder
            .stream(input, Consumed.with(Serdes.String(), Serdes.String()))
            .peek((k, v) -> {
                long now = System.nanoTime();
                firstNanos.compareAndSet(0, now);
                lastNanos.set(now);
                seen.incrementAndGet();
            });
        switch (mode) {
            case "stateless" -> source
                .filter((k, v) -> Data.keep(v))
                .map((k, v) -> KeyValue.pair(k, Data.mapped(k, v)))
                .to(output, Produced.with(Serdes.String(), Serdes.String()));
            case "count" -> source
                .groupByKey()
                .count()
                .toStream()
                .to(output, Produced.with(Serdes.String(), Serdes.Long()));
            default -> {
                System.err.println("mode must be stateless or count, not " + mode);
                System.exit(64);
            }
        }

        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        streams.setUncaughtExceptionHandler(e -> {
            System.err.println("uncaught: " + e);
            return org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler
                .StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        streams.start();
        long lastSeen = -1;
        long lastChange = System.nanoTime();
        while (seen.get() < expected) {
            Thread.sleep(5);
            long s = seen.get();
            if (s != lastSeen) {
                lastSeen = s;
                lastChange = System.nanoTime();
            } else if (System.nanoTime() - lastChange > 120_000_000_000L) {
                System.err.println("idle for 120 s after " + s + " of " + expected + " records");
                streams.close(Duration.ofSeconds(30));
                System.exit(2);
            }
            if (streams.state() == KafkaStreams.State.ERROR || streams.state() == KafkaStreams.State.NOT_RUNNING) {
                System.err.println("Kafka Streams stopped: " + streams.state());
                System.exit(3);
            }
        }
        long reached = System.nanoTime();
        // close() commits the processed offsets, flushes the store caches and the producer
        // (with exactly_once_v2: commits the open transaction).
        boolean closed = streams.close(Duration.ofSeconds(120));
        long end = System.nanoTime();
        if (!closed) {
            System.err.println("close() timed out");
            System.exit(4);
        }
        System.out.printf(
            "{\"records\":%d,\"seconds\":%.3f,\"seconds_to_last_record\":%.3f,\"seconds_close\":%.3f,"
                + "\"seconds_from_start\":%.3f,\"seconds_start_to_first_record\":%.3f}%n",
            seen.get(),
            (end - firstNanos.get()) / 1e9,
            (lastNanos.get() - firstNanos.get()) / 1e9,
            (end - reached) / 1e9,
            (end - startNanos) / 1e9,
            (firstNanos.get() - startNanos) / 1e9);
    }
}
