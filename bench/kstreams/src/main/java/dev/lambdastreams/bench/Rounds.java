package dev.lambdastreams.bench;

import java.util.Map;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.kafka.clients.admin.AdminClient;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * Feeds a consumer group one round at a time, so that each of its batches holds every
 * partition of the topic: {@code java -cp kstreams-bench.jar dev.lambdastreams.bench.Rounds
 * BOOTSTRAP TOPIC GROUP PARTITIONS PER_PARTITION ROUNDS KEYS}.
 *
 * <p>Round {@code n} produces records {@code n * P * PER_PARTITION} onwards, as {@link Data}
 * describes them, record {@code i} to partition {@code i mod P} (so exactly PER_PARTITION
 * records in each partition), then waits until GROUP has committed everything produced so
 * far (the local runner commits after each successful batch) before the next round. A
 * runner with {@code --batch-size P * PER_PARTITION} and a long batching window then forms
 * one event per round holding every partition. The input is the same as {@link Produce}'s
 * for {@code ROUNDS * P * PER_PARTITION} records (only the partitions differ), so
 * {@link Verify} checks the output. Prints one JSON line (the milliseconds each round took,
 * produce to committed); exits 1 when a round is not committed within 180 s.
 */
public final class Rounds {
    private Rounds() {}

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1], group = args[2];
        int partitions = Integer.parseInt(args[3]);
        int perPartition = Integer.parseInt(args[4]);
        int rounds = Integer.parseInt(args[5]);
        int keys = Integer.parseInt(args[6]);
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        props.put(ProducerConfig.LINGER_MS_CONFIG, 0);
        Properties adminProps = new Properties();
        adminProps.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        AtomicReference<Exception> failure = new AtomicReference<>();
        StringBuilder times = new StringBuilder();
        long perRound = (long) partitions * perPartition;
        try (KafkaProducer<String, String> producer =
                        new KafkaProducer<>(props, new StringSerializer(), new StringSerializer());
                AdminClient admin = AdminClient.create(adminProps)) {
            for (int round = 0; round < rounds; round++) {
                long t0 = System.nanoTime();
                for (long i = round * perRound; i < (round + 1) * perRound; i++) {
                    producer.send(new ProducerRecord<>(topic, (int) (i % partitions), Data.key(i, keys), Data.value(i)),
                            (m, e) -> {
                                if (e != null) failure.compareAndSet(null, e);
                            });
                }
                producer.flush();
                if (failure.get() != null) {
                    System.err.println("producing failed: " + failure.get());
                    System.exit(1);
                }
                long target = (round + 1) * perRound;
                long deadline = System.nanoTime() + 180_000_000_000L;
                while (committed(admin, group, topic) < target) {
                    if (System.nanoTime() > deadline) {
                        System.err.println("round " + round + ": group " + group + " did not commit "
                                + target + " records within 180 s");
                        System.exit(1);
                    }
                    Thread.sleep(5);
                }
                times.append(round == 0 ? "" : ",").append((System.nanoTime() - t0) / 1_000_000);
            }
        }
        System.out.printf("{\"produced\":%d,\"rounds\":%d,\"round_ms\":[%s]}%n", rounds * perRound, rounds, times);
    }

    /** The sum of GROUP's committed offsets of TOPIC's partitions (0 when none). */
    private static long committed(AdminClient admin, String group, String topic) throws Exception {
        Map<TopicPartition, OffsetAndMetadata> offsets =
                admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get();
        long sum = 0;
        for (var e : offsets.entrySet()) {
            if (e.getKey().topic().equals(topic) && e.getValue() != null) {
                sum += e.getValue().offset();
            }
        }
        return sum;
    }
}
