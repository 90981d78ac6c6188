/*
 * The load generator of `python -m starlight_py.bench.scale` (starlight_py/bench/scale.py).
 *
 * Compiled at run time with javac against com.rabbitmq:amqp-client (scale_load.py fetches it
 * with Maven into the bench's cache folder). Python-side clients would be the bottleneck at
 * 10,000 queues; this one is not, and it does what PerfTest cannot express in one process:
 * round robin over N topic routing keys with one consumer per queue, per-message latency,
 * and every message accounted for.
 *
 * Arguments are key=value pairs. Two modes:
 *
 *   mode=topology  kind=topic|default|fanout queues=N: declare (and bind, for topic and
 *     fanout) N queues and start one consumer on each, spread over `connections`
 *     connections, each connection's share declared by a thread of its own; stay idle
 *     `idle` s; publish at `rate` deliveries/s in total with publisher confirms, manual
 *     acks: an unmeasured warm-up of `warmup` s that goes on until every queue has
 *     delivered its first message (at most `first_wait` s more), then `duration` s
 *     measured; wait up to `drain` s for the stragglers; cancel the consumers and delete
 *     the queues and exchange, again from `connections` threads. The first message each
 *     queue delivers is reported on its own (event first_deliveries): a system that makes
 *     something on a binding's first use pays for it there, not in the measured window.
 *   mode=connections count=N: open N connections (heartbeat `heartbeat` s, NIO), stay
 *     idle `idle` s, close them.
 *
 * Output: one JSON object per line, prefixed "@scale ", read by scale_load.py. The Python
 * side reads the servers' CPU when the lines idle_begin, idle_end, window_begin and
 * window_end arrive, so each is printed right at its moment. Anything else on stdout or
 * stderr (the client's own warnings) is only logged.
 *
 * Body (at least 24 bytes, padded to `size`): publish time (System.nanoTime, so publisher
 * and consumer must be this one JVM), sequence number (the channel's publish sequence
 * number, 1-based), the queue it is routed to (-1: fanout, every queue). A message is lost
 * when it was confirmed and one of the queues it was routed to never delivered it.
 */

import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.Connection;
import com.rabbitmq.client.ConnectionFactory;
import com.rabbitmq.client.DefaultConsumer;
import com.rabbitmq.client.Envelope;
import com.rabbitmq.client.MessageProperties;
import com.rabbitmq.client.impl.nio.NioParams;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.BitSet;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentSkipListSet;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.LockSupport;

public final class ScaleLoad {
  private static final long START = System.nanoTime();
  private final Map<String, String> options;

  private ScaleLoad(Map<String, String> options) {
    this.options = options;
  }

  public static void main(String[] args) throws Exception {
    Map<String, String> options = new HashMap<>();
    for (String arg : args) {
      int eq = arg.indexOf('=');
      if (eq <= 0) {
        fail("arguments are key=value, not " + arg);
      }
      options.put(arg.substring(0, eq), arg.substring(eq + 1));
    }
    ScaleLoad load = new ScaleLoad(options);
    String mode = load.text("mode", "topology");
    int code;
    try {
      if (mode.equals("topology")) {
        code = load.topology();
      } else if (mode.equals("connections")) {
        code = load.connections();
      } else {
        fail("mode is topology or connections, not " + mode);
        code = 2;
      }
    } catch (Exception e) {
      // Reported, and the process ends: its connections' threads would otherwise keep
      // the JVM, and the case, waiting for nothing.
      emit("error", "phase", "run", "message", describe(e));
      e.printStackTrace();
      code = 3;
    }
    System.out.flush();
    System.exit(code);
  }

  // --- options and output ------------------------------------------------------------

  private String text(String key, String fallback) {
    return options.getOrDefault(key, fallback);
  }

  private String required(String key) {
    String value = options.get(key);
    if (value == null) {
      fail("missing argument " + key + "=...");
    }
    return value;
  }

  private int number(String key, int fallback) {
    return Integer.parseInt(text(key, Integer.toString(fallback)));
  }

  private double decimal(String key, double fallback) {
    return Double.parseDouble(text(key, Double.toString(fallback)));
  }

  private static void fail(String message) {
    emit("error", "message", message);
    System.out.flush();
    System.exit(2);
  }

  /** One "@scale" line: the event, then key/value pairs (numbers stay numbers). */
  static synchronized void emit(String event, Object... pairs) {
    StringBuilder line = new StringBuilder("@scale {\"event\":\"").append(event).append('"');
    line.append(",\"t_ms\":").append((System.nanoTime() - START) / 1_000_000);
    for (int i = 0; i + 1 < pairs.length; i += 2) {
      line.append(",\"").append(pairs[i]).append("\":");
      Object value = pairs[i + 1];
      if (value instanceof Number) {
        line.append(value);
      } else if (value instanceof long[]) {
        line.append(Arrays.toString((long[]) value).replace(" ", ""));
      } else {
        line.append('"').append(escape(String.valueOf(value))).append('"');
      }
    }
    System.out.println(line.append('}'));
    System.out.flush();
  }

  private static String escape(String text) {
    StringBuilder out = new StringBuilder();
    for (char c : text.toCharArray()) {
      if (c == '"' || c == '\\') {
        out.append('\\').append(c);
      } else if (c < 0x20) {
        out.append(String.format("\\u%04x", (int) c));
      } else {
        out.append(c);
      }
    }
    return out.toString();
  }

  private static long millisSince(long startNanos) {
    return (System.nanoTime() - startNanos) / 1_000_000;
  }

  private ConnectionFactory factory(ExecutorService consumers) throws Exception {
    ConnectionFactory factory = new ConnectionFactory();
    factory.setUri(required("uri"));
    factory.setRequestedHeartbeat(number("heartbeat", 60));
    factory.setAutomaticRecoveryEnabled(false);
    factory.setTopologyRecoveryEnabled(false);
    factory.setConnectionTimeout(60_000);
    factory.setHandshakeTimeout(60_000);
    factory.setShutdownTimeout(0);
    // A declaration, bind, cancel or delete unanswered this long fails the case instead of
    // holding the run (the client's default is 10 minutes).
    factory.setChannelRpcTimeout((int) (decimal("rpc_timeout", 120) * 1000));
    if (consumers != null) {
      factory.setSharedExecutor(consumers);
    }
    return factory;
  }

  /** Runs `work` for 0..parts-1 on a thread each; the first failure, or null. */
  private static Exception inParallel(int parts, PartWork work) throws InterruptedException {
    List<Thread> threads = new ArrayList<>();
    Exception[] failure = new Exception[1];
    for (int part = 0; part < parts; part++) {
      final int index = part;
      Thread thread =
          new Thread(
              () -> {
                try {
                  work.run(index);
                } catch (Exception e) {
                  synchronized (failure) {
                    if (failure[0] == null) {
                      failure[0] = e;
                    }
                  }
                }
              },
              "scale-part-" + part);
      thread.start();
      threads.add(thread);
    }
    for (Thread thread : threads) {
      thread.join();
    }
    return failure[0];
  }

  interface PartWork {
    void run(int part) throws Exception;
  }

  /** Prints {"event":"progress"} every 2 s while a phase runs. */
  private static Thread progress(String phase, AtomicInteger done, int of) {
    Thread reporter =
        new Thread(
            () -> {
              try {
                while (true) {
                  Thread.sleep(2000);
                  emit("progress", "phase", phase, "done", done.get(), "of", of);
                }
              } catch (InterruptedException e) {
                // the phase is over
              }
            },
            "scale-progress");
    reporter.setDaemon(true);
    reporter.start();
    return reporter;
  }

  private static String describe(Exception e) {
    Throwable cause = e;
    while (cause.getCause() != null && cause.getMessage() == null) {
      cause = cause.getCause();
    }
    String message = cause.getMessage();
    if (message == null && e.getCause() != null) {
      message = String.valueOf(e.getCause());
    }
    return cause.getClass().getSimpleName() + ": " + message;
  }

  // --- mode=topology -------------------------------------------------------------------

  private int topology() throws Exception {
    String kind = required("kind");
    int queues = number("queues", 1);
    String prefix = required("prefix");
    int connections = Math.max(1, Math.min(number("connections", 8), queues));
    int size = Math.max(24, number("size", 256));
    int prefetch = number("prefetch", 100);
    double rate = decimal("rate", 500);
    double idle = decimal("idle", 10);
    double warmup = decimal("warmup", 5);
    double duration = decimal("duration", 20);
    double drain = decimal("drain", 30);
    if (!kind.equals("topic") && !kind.equals("default") && !kind.equals("fanout")) {
      fail("kind is topic, default or fanout, not " + kind);
    }
    String exchange = kind.equals("default") ? "" : prefix + "-x";
    Topology topology = new Topology(kind, prefix, queues, exchange);

    ExecutorService dispatch = Executors.newFixedThreadPool(4);
    ConnectionFactory factory = factory(dispatch);
    List<Connection> consuming = new ArrayList<>();
    for (int i = 0; i < connections; i++) {
      consuming.add(factory.newConnection("scale-consume-" + i));
    }
    Connection publishing = factory.newConnection("scale-publish");
    Channel admin = publishing.createChannel();
    emit("connected", "connections", connections + 1);

    // Setup: declare, bind, start the consumers; timed from the first declaration.
    Consumers consumers = new Consumers(queues, topology);
    AtomicInteger ready = new AtomicInteger();
    emit("setup_begin");
    long began = System.nanoTime();
    if (!exchange.isEmpty()) {
      admin.exchangeDeclare(exchange, kind, true);
    }
    Thread reporter = progress("setup", ready, queues);
    Exception failure =
        inParallel(
            connections,
            part -> {
              for (int q = part; q < queues; q += connections) {
                Channel channel = consuming.get(part).createChannel();
                consumers.channels[q] = channel;
                channel.queueDeclare(topology.queue(q), true, false, false, null);
                if (!exchange.isEmpty()) {
                  channel.queueBind(topology.queue(q), exchange, topology.bindingKey(q));
                }
                channel.basicQos(prefetch);
                channel.basicConsume(
                    topology.queue(q), false, "scale-" + q, consumers.consumer(q, channel));
                ready.incrementAndGet();
              }
            });
    reporter.interrupt();
    long setupMs = millisSince(began);
    if (failure != null) {
      emit("error", "phase", "setup", "message", describe(failure), "ready", ready.get());
      delete(consumers, topology, consuming, admin, connections);
      return 3;
    }
    emit("setup_done", "ms", setupMs, "queues", queues, "connections", connections);

    // Idle: consumers attached, nothing published.
    emit("idle_begin");
    Thread.sleep((long) (idle * 1000));
    emit("idle_end", "delivered", consumers.delivered.get());

    // Traffic at a fixed rate, deliveries counted in the window.
    Publisher publisher = new Publisher(publishing, topology, rate, size);
    Thread publishThread = new Thread(publisher, "scale-publish");
    emit("traffic_begin", "publish_rate", publisher.publishRate);
    long trafficBegan = System.nanoTime();
    publishThread.start();
    Thread.sleep((long) (warmup * 1000));
    long firstUntil = System.nanoTime() + (long) (decimal("first_wait", 120) * 1e9);
    while (consumers.firstDelivered.get() < queues && System.nanoTime() < firstUntil) {
      Thread.sleep(20);
    }
    long[] firsts = consumers.firstLatencies();
    emit(
        "first_deliveries",
        "queues", queues,
        "reached", firsts.length,
        "last_ms", consumers.lastFirstMs(trafficBegan),
        "latency_us", percentiles(firsts));
    long deliveredBefore = consumers.delivered.get();
    long publishedBefore = publisher.published.get();
    long windowStart = System.nanoTime();
    consumers.openWindow();
    emit("window_begin");
    Thread.sleep((long) (duration * 1000));
    long[] latencies = consumers.closeWindow();
    long windowNanos = System.nanoTime() - windowStart;
    long deliveredIn = consumers.delivered.get() - deliveredBefore;
    long publishedIn = publisher.published.get() - publishedBefore;
    emit(
        "window_end",
        "seconds", windowNanos / 1e9,
        "delivered", deliveredIn,
        "published", publishedIn,
        "latency_samples", latencies.length,
        "latency_us", percentiles(latencies));
    publisher.stop();
    publishThread.join();

    // Drain: every confirm, then every expected delivery, or the deadline.
    long drainUntil = System.nanoTime() + (long) (drain * 1e9);
    while (publisher.outstanding.size() > 0 && System.nanoTime() < drainUntil) {
      Thread.sleep(20);
    }
    while (consumers.missing(publisher) > 0 && System.nanoTime() < drainUntil) {
      Thread.sleep(50);
    }
    long lost = consumers.missing(publisher);
    emit(
        "drained",
        "published", publisher.published.get(),
        "confirmed", publisher.confirmed.get(),
        "nacked", publisher.nacked.get(),
        "returned", publisher.returned.get(),
        "unconfirmed", publisher.outstanding.size(),
        "skipped_slots", publisher.skipped.get(),
        "delivered", consumers.delivered.get(),
        "redelivered", consumers.redelivered.get(),
        "duplicates", consumers.duplicates.get(),
        "misrouted", consumers.misrouted.get(),
        "lost", lost,
        "publish_error", publisher.error == null ? "" : publisher.error);

    int code = delete(consumers, topology, consuming, admin, connections);
    publishing.abort(5000);
    dispatch.shutdownNow();
    return code;
  }

  /** Cancels the consumers, deletes the queues and the exchange; emits delete_done. */
  private int delete(
      Consumers consumers,
      Topology topology,
      List<Connection> consuming,
      Channel admin,
      int connections)
      throws Exception {
    AtomicInteger deleted = new AtomicInteger();
    emit("delete_begin");
    long began = System.nanoTime();
    Thread reporter = progress("delete", deleted, topology.queues);
    Exception failure =
        inParallel(
            connections,
            part -> {
              Channel spare = null;
              for (int q = part; q < topology.queues; q += connections) {
                Channel channel = consumers.channels[q];
                if (channel == null || !channel.isOpen()) {
                  if (spare == null || !spare.isOpen()) {
                    spare = consuming.get(part).createChannel();
                  }
                  channel = spare;
                } else if (consumers.consuming[q]) {
                  channel.basicCancel("scale-" + q);
                }
                channel.queueDelete(topology.queue(q));
                if (channel != spare) {
                  channel.close();
                }
                deleted.incrementAndGet();
              }
            });
    if (failure == null && !topology.exchange.isEmpty()) {
      try {
        admin.exchangeDelete(topology.exchange);
      } catch (IOException e) {
        failure = e;
      }
    }
    reporter.interrupt();
    long ms = millisSince(began);
    for (Connection connection : consuming) {
      connection.abort(5000);
    }
    if (failure != null) {
      emit("error", "phase", "delete", "message", describe(failure), "deleted", deleted.get());
      return 3;
    }
    emit("delete_done", "ms", ms, "queues", topology.queues);
    return 0;
  }

  static long[] percentiles(long[] sorted) {
    if (sorted.length == 0) {
      return new long[0];
    }
    double[] ranks = {0.5, 0.99, 1.0};
    long[] values = new long[ranks.length];
    for (int i = 0; i < ranks.length; i++) {
      int index = (int) Math.ceil(ranks[i] * sorted.length) - 1;
      values[i] = sorted[Math.max(0, Math.min(sorted.length - 1, index))];
    }
    return values;
  }

  /** Names and routing of one case. */
  static final class Topology {
    final String kind;
    final String prefix;
    final int queues;
    final String exchange;

    Topology(String kind, String prefix, int queues, String exchange) {
      this.kind = kind;
      this.prefix = prefix;
      this.queues = queues;
      this.exchange = exchange;
    }

    String queue(int q) {
      return prefix + "-" + q;
    }

    String bindingKey(int q) {
      return kind.equals("topic") ? "t." + q + ".*" : "";
    }

    /** The queue that message `seq` (1-based) goes to; -1 when it goes to every queue. */
    int target(long seq) {
      return kind.equals("fanout") ? -1 : (int) ((seq - 1) % queues);
    }

    String routingKey(int target) {
      if (kind.equals("topic")) {
        return "t." + target + ".x";
      }
      return kind.equals("default") ? queue(target) : "";
    }

    int width() {
      return kind.equals("fanout") ? queues : 1;
    }
  }

  /** One consumer per queue; what each delivered, and the window's latencies. */
  static final class Consumers {
    final Channel[] channels;
    final boolean[] consuming;
    final BitSet[] seen;
    final Topology topology;
    final AtomicLong delivered = new AtomicLong();
    final AtomicLong redelivered = new AtomicLong();
    final AtomicLong duplicates = new AtomicLong();
    final AtomicLong misrouted = new AtomicLong();
    final AtomicInteger firstDelivered = new AtomicInteger();
    private final long[] firstLatency; // µs of each queue's first delivery; -1: none yet
    private final long[] firstAt; // System.nanoTime of it
    private volatile boolean window;
    private long[] latencies = new long[1 << 14];
    private int latencyCount;

    Consumers(int queues, Topology topology) {
      this.channels = new Channel[queues];
      this.consuming = new boolean[queues];
      this.seen = new BitSet[queues];
      this.topology = topology;
      this.firstLatency = new long[queues];
      this.firstAt = new long[queues];
      Arrays.fill(firstLatency, -1);
      for (int q = 0; q < queues; q++) {
        seen[q] = new BitSet();
      }
    }

    private void first(int q, long micros, long now) {
      synchronized (firstLatency) {
        if (firstLatency[q] < 0) {
          firstLatency[q] = micros;
          firstAt[q] = now;
          firstDelivered.incrementAndGet();
        }
      }
    }

    /** The first deliveries' latencies so far, sorted. */
    long[] firstLatencies() {
      synchronized (firstLatency) {
        return Arrays.stream(firstLatency).filter(v -> v >= 0).sorted().toArray();
      }
    }

    /** Milliseconds from `since` to the latest first delivery so far (0: none). */
    long lastFirstMs(long since) {
      synchronized (firstLatency) {
        long last = since;
        for (int q = 0; q < firstAt.length; q++) {
          if (firstLatency[q] >= 0) {
            last = Math.max(last, firstAt[q]);
          }
        }
        return (last - since) / 1_000_000;
      }
    }

    DefaultConsumer consumer(int q, Channel channel) {
      consuming[q] = true;
      return new DefaultConsumer(channel) {
        @Override
        public void handleDelivery(
            String tag, Envelope envelope, AMQP.BasicProperties properties, byte[] body)
            throws IOException {
          long now = System.nanoTime();
          ByteBuffer buffer = ByteBuffer.wrap(body);
          long sent = buffer.getLong();
          long seq = buffer.getLong();
          int target = buffer.getInt();
          delivered.incrementAndGet();
          if (envelope.isRedeliver()) {
            redelivered.incrementAndGet();
          }
          if (target >= 0 && target != q) {
            misrouted.incrementAndGet();
          }
          boolean again;
          synchronized (seen[q]) {
            again = seen[q].get((int) seq);
            seen[q].set((int) seq);
          }
          if (again) {
            duplicates.incrementAndGet();
          }
          first(q, (now - sent) / 1000, now);
          if (window) {
            record((now - sent) / 1000);
          }
          getChannel().basicAck(envelope.getDeliveryTag(), false);
        }

        @Override
        public void handleCancel(String tag) {
          consuming[q] = false;
        }
      };
    }

    private synchronized void record(long micros) {
      if (latencyCount == latencies.length) {
        latencies = Arrays.copyOf(latencies, latencies.length * 2);
      }
      latencies[latencyCount++] = micros;
    }

    synchronized void openWindow() {
      latencyCount = 0;
      window = true;
    }

    synchronized long[] closeWindow() {
      window = false;
      long[] sorted = Arrays.copyOf(latencies, latencyCount);
      Arrays.sort(sorted);
      return sorted;
    }

    /** Confirmed messages that a queue they were routed to has not delivered. */
    long missing(Publisher publisher) {
      BitSet confirmed = publisher.confirmedSet();
      long missing = 0;
      for (int seq = confirmed.nextSetBit(1); seq >= 0; seq = confirmed.nextSetBit(seq + 1)) {
        int target = topology.target(seq);
        if (target >= 0) {
          missing += has(target, seq) ? 0 : 1;
        } else {
          for (int q = 0; q < topology.queues; q++) {
            missing += has(q, seq) ? 0 : 1;
          }
        }
      }
      return missing;
    }

    private boolean has(int q, int seq) {
      synchronized (seen[q]) {
        return seen[q].get(seq);
      }
    }
  }

  /** Publishes at a fixed rate on one channel with confirms (at most 1,000 unconfirmed). */
  static final class Publisher implements Runnable {
    static final int MAX_UNCONFIRMED = 1000;
    final Channel channel;
    final Topology topology;
    final double publishRate;
    final int size;
    final AtomicLong published = new AtomicLong();
    final AtomicLong confirmed = new AtomicLong();
    final AtomicLong nacked = new AtomicLong();
    final AtomicLong returned = new AtomicLong();
    final AtomicLong skipped = new AtomicLong();
    final ConcurrentSkipListSet<Long> outstanding = new ConcurrentSkipListSet<>();
    private final BitSet confirmedSeqs = new BitSet();
    private final Semaphore window = new Semaphore(MAX_UNCONFIRMED);
    private volatile boolean running = true;
    volatile String error;

    Publisher(Connection connection, Topology topology, double rate, int size)
        throws IOException {
      this.channel = connection.createChannel();
      this.topology = topology;
      // The rate counts deliveries: a fanout message is delivered once per queue.
      this.publishRate = rate / topology.width();
      this.size = size;
      channel.confirmSelect();
      channel.addReturnListener(r -> returned.incrementAndGet());
      channel.addConfirmListener(
          (tag, multiple) -> settle(tag, multiple, true),
          (tag, multiple) -> settle(tag, multiple, false));
    }

    private void settle(long tag, boolean multiple, boolean ack) {
      List<Long> done = new ArrayList<>();
      if (multiple) {
        done.addAll(outstanding.headSet(tag, true));
      } else if (outstanding.contains(tag)) {
        done.add(tag);
      }
      for (Long seq : done) {
        if (outstanding.remove(seq)) {
          if (ack) {
            confirmed.incrementAndGet();
            synchronized (confirmedSeqs) {
              confirmedSeqs.set(seq.intValue());
            }
          } else {
            nacked.incrementAndGet();
          }
          window.release();
        }
      }
    }

    BitSet confirmedSet() {
      synchronized (confirmedSeqs) {
        return (BitSet) confirmedSeqs.clone();
      }
    }

    void stop() {
      running = false;
    }

    @Override
    public void run() {
      long period = (long) (1e9 / publishRate);
      long next = System.nanoTime();
      byte[] body = new byte[size];
      try {
        while (running) {
          long now = System.nanoTime();
          if (now < next) {
            LockSupport.parkNanos(next - now);
            continue;
          }
          // A slot missed by more than 100 ms is skipped, not sent in a burst.
          while (now - next > 100_000_000L) {
            next += period;
            skipped.incrementAndGet();
          }
          next += period;
          if (!window.tryAcquire(1, TimeUnit.SECONDS)) {
            continue;
          }
          long seq = channel.getNextPublishSeqNo();
          int target = topology.target(seq);
          ByteBuffer.wrap(body).putLong(System.nanoTime()).putLong(seq).putInt(target);
          outstanding.add(seq);
          channel.basicPublish(
              topology.exchange,
              topology.routingKey(target),
              true,
              MessageProperties.PERSISTENT_BASIC,
              body);
          published.incrementAndGet();
        }
      } catch (Exception e) {
        error = describe(e);
      }
    }
  }

  // --- mode=connections ----------------------------------------------------------------

  private int connections() throws Exception {
    int count = number("count", 1000);
    int threads = Math.max(1, number("threads", 8));
    double idle = decimal("idle", 10);
    ScheduledExecutorService heartbeats = Executors.newScheduledThreadPool(2);
    ExecutorService shared = Executors.newFixedThreadPool(2);
    ConnectionFactory factory = factory(shared);
    factory.useNio();
    factory.setNioParams(new NioParams().setNbIoThreads(4));
    factory.setHeartbeatExecutor(heartbeats);
    Connection[] opened = new Connection[count];
    AtomicInteger open = new AtomicInteger();
    AtomicInteger failed = new AtomicInteger();
    String[] firstFailure = new String[1];
    long began = System.nanoTime();
    Thread reporter = progress("connect", open, count);
    // A connection that fails (a handshake timeout under load) is counted, not fatal: the
    // idle window then measures the ones that opened.
    inParallel(
        threads,
        part -> {
          for (int i = part; i < count; i += threads) {
            try {
              opened[i] = factory.newConnection("scale-idle-" + i);
              open.incrementAndGet();
            } catch (Exception e) {
              failed.incrementAndGet();
              synchronized (firstFailure) {
                if (firstFailure[0] == null) {
                  firstFailure[0] = describe(e);
                }
              }
            }
          }
        });
    reporter.interrupt();
    long openMs = millisSince(began);
    int code = 0;
    if (open.get() == 0) {
      emit("error", "phase", "connect", "message", firstFailure[0], "open", 0);
      code = 3;
    } else {
      emit(
          "connections_open",
          "ms", openMs,
          "count", open.get(),
          "failed", failed.get(),
          "first_failure", firstFailure[0] == null ? "" : firstFailure[0]);
      emit("idle_begin");
      Thread.sleep((long) (idle * 1000));
      int alive = 0;
      for (Connection connection : opened) {
        alive += connection != null && connection.isOpen() ? 1 : 0;
      }
      emit("idle_end", "alive", alive);
    }
    // Closed from `threads` threads, each close waiting 200 ms at most for close-ok, and
    // 30 s in all: what is left is closed by the process's exit.
    long closing = System.nanoTime();
    ExecutorService closers = Executors.newFixedThreadPool(threads);
    for (Connection connection : opened) {
      if (connection != null) {
        closers.submit(() -> connection.abort(200));
      }
    }
    closers.shutdown();
    boolean closed = closers.awaitTermination(30, TimeUnit.SECONDS);
    emit("closed", "ms", millisSince(closing), "all", closed ? 1 : 0);
    heartbeats.shutdownNow();
    shared.shutdownNow();
    return code;
  }
}
