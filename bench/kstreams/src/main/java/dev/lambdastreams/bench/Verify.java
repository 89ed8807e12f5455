package dev.lambdastreams.bench;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * Checks an output topic of the benchmark (read_committed, every partition from the start):
 * {@code java -cp kstreams-bench.jar dev.lambdastreams.bench.Verify BOOTSTRAP TOPIC
 * stateless|count RECORDS KEYS}.
 *
 * <ul>
 * <li>stateless: exactly one output record per input record with amount &ge; 50, each
 *     {@code key:even number in 100..198};
 * <li>count: every key's final count (the record with the highest
 *     {@code lambda-streams-version} header when there is one, else the last in its
 *     partition) is the number of input records of that key; values are 8-byte big-endian.
 * </ul>
 * Prints one JSON line; exits 1 when the output is wrong.
 */
public final class Verify {
    private Verify() {}

    public static void main(String[] args) {
        String bootstrap = args[0], topic = args[1], mode = args[2];
        long records = Long.parseLong(args[3]);
        int keys = Integer.parseInt(args[4]);
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
        props.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, 10_000);
        List<String> errors = new ArrayList<>();
        long outputs = 0;
        Map<String, long[]> finals = new HashMap<>(); // key -> {version, count}
        try (KafkaConsumer<byte[], byte[]> consumer =
                new KafkaConsumer<>(props, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
            List<TopicPartition> tps = new ArrayList<>();
            for (PartitionInfo p : consumer.partitionsFor(topic, Duration.ofSeconds(30))) {
                tps.add(new TopicPartition(topic, p.partition()));
            }
            consumer.assign(tps);
            consumer.seekToBeginning(tps);
            Map<TopicPartition, Long> end = consumer.endOffsets(tps, Duration.ofSeconds(30));
            long idleSince = System.nanoTime();
            while (true) {
                boolean done = true;
                for (TopicPartition tp : tps) {
                    if (consumer.position(tp, Duration.ofSeconds(30)) < end.get(tp)) {
                        done = false;
                    }
                }
                if (done) {
                    break;
                }
                var batch = consumer.poll(Duration.ofMillis(500));
                if (batch.isEmpty()) {
                    if (System.nanoTime() - idleSince > 60_000_000_000L) {
                        errors.add("no progress reading " + topic + " for 60 s");
                        break;
                    }
                    continue;
                }
                idleSince = System.nanoTime();
                for (ConsumerRecord<byte[], byte[]> r : batch) {
                    outputs++;
                    String key = r.key() == null ? null : new String(r.key(), StandardCharsets.UTF_8);
                    if (key == null || r.value() == null) {
                        if (errors.size() < 10) errors.add("null key or value at " + r.partition() + "@" + r.offset());
                        continue;
                    }
                    if (mode.equals("stateless")) {
                        String v = new String(r.value(), StandardCharsets.UTF_8);
                        String prefix = key + ":";
                        boolean ok = v.startsWith(prefix);
                        if (ok) {
                            try {
                                int n = Integer.parseInt(v.substring(prefix.length()));
                                ok = n % 2 == 0 && n >= 100 && n < 200;
                            } catch (NumberFormatException e) {
                                ok = false;
                            }
                        }
                        if (!ok && errors.size() < 10) errors.add("unexpected value " + v + " for key " + key);
                    } else {
                        if (r.value().length != 8) {
                            if (errors.size() < 10) errors.add("count value of " + r.value().length + " bytes for key " + key);
                            continue;
                        }
                        long count = ByteBuffer.wrap(r.value()).getLong();
                        Header h = r.headers().lastHeader("lambda-streams-version");
                        long version = h == null ? Long.MAX_VALUE
                            : Long.parseLong(new String(h.value(), StandardCharsets.UTF_8));
                        long[] f = finals.get(key);
                        if (f == null) {
                            finals.put(key, new long[] {version, count});
                        } else if (h == null || version >= f[0]) {
                            // Without versions: the later record of the key's partition wins.
                            f[0] = version;
                            f[1] = count;
                        }
                    }
                }
            }
        }
        long expectedOutputs = -1;
        if (mode.equals("stateless")) {
            expectedOutputs = 0;
            for (long i = 0; i < records; i++) {
                if (Data.amount(i) >= 50) expectedOutputs++;
            }
            if (outputs != expectedOutputs) {
                errors.add("expected " + expectedOutputs + " output records, found " + outputs);
            }
        } else {
            long wrong = 0;
            for (int k = 0; k < keys; k++) {
                long expected = records / keys + (k < records % keys ? 1 : 0);
                if (expected == 0) continue;
                long[] f = finals.get("key-" + k);
                long got = f == null ? -1 : f[1];
                if (got != expected) {
                    wrong++;
                    if (errors.size() < 10) errors.add("key-" + k + ": expected count " + expected + ", found " + got);
                }
            }
            if (finals.size() != Math.min(keys, records)) {
                errors.add("expected " + Math.min(keys, records) + " keys, found " + finals.size());
            }
            if (wrong > 0) errors.add(wrong + " keys with a wrong count");
        }
        StringBuilder json = new StringBuilder();
        json.append("{\"ok\":").append(errors.isEmpty())
            .append(",\"output_records\":").append(outputs)
            .append(",\"expected_output_records\":").append(expectedOutputs)
            .append(",\"keys\":").append(finals.size())
            .append(",\"errors\":[");
        for (int i = 0; i < errors.size(); i++) {
            if (i > 0) json.append(',');
            json.append('"').append(errors.get(i).replace("\\", "\\\\").replace("\"", "\\\"")).append('"');
        }
        json.append("]}");
        System.out.println(json);
        System.exit(errors.isEmpty() ? 0 : 1);
    }
}
