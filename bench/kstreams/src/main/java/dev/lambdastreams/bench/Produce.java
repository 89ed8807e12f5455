package dev.lambdastreams.bench;

import java.util.Properties;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * Fills the benchmark's input topic: {@code java -cp kstreams-bench.jar
 * dev.lambdastreams.bench.Produce BOOTSTRAP TOPIC RECORDS KEYS}. Records as {@link Data}
 * describes them, partitioned by key with the default (murmur2) partitioner, idempotent.
 */
public final class Produce {
    private Produce() {}

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1];
        long records = Long.parseLong(args[2]);
        int keys = Integer.parseInt(args[3]);
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        props.put(ProducerConfig.LINGER_MS_CONFIG, 20);
        props.put(ProducerConfig.BATCH_SIZE_CONFIG, 256 * 1024);
        AtomicReference<Exception> failure = new AtomicReference<>();
        try (KafkaProducer<String, String> producer =
                new KafkaProducer<>(props, new StringSerializer(), new StringSerializer())) {
            for (long i = 0; i < records && failure.get() == null; i++) {
                producer.send(new ProducerRecord<>(topic, Data.key(i, keys), Data.value(i)), (m, e) -> {
                    if (e != null) {
                        failure.compareAndSet(null, e);
                    }
                });
            }
            producer.flush();
        }
        if (failure.get() != null) {
            System.err.println("producing failed: " + failure.get());
            System.exit(1);
        }
        System.out.printf("{\"produced\":%d,\"keys\":%d}%n", records, keys);
    }
}
