/*
 * starlight-py's broker plugin: each subscription's backlog counted in messages.
 *
 * Pulsar's own stats count a subscription's backlog in entries (msgBacklog): with producer
 * batching, an entry holds many messages, and a message acknowledged by batch index still
 * counts until its whole entry is. AMQP's message_count needs messages. This servlet
 * (loaded by the broker as an "additional servlet") computes them from the cursor's state
 * and the cumulative message index every entry carries once the broker runs
 * AppendIndexMetadataInterceptor (brokerEntryMetadataInterceptors):
 *
 *   messages = index(last entry) - messages before the first unacknowledged entry
 *              - messages of the entries acknowledged out of order (per deleted range)
 *              - messages acknowledged by batch index in entries still partly unacknowledged
 *
 * which reads a handful of entries (two per deleted range, one per partly acknowledged
 * entry; recent ones come from the broker's cache) instead of the whole backlog.
 *
 * GET <base>/backlog?topic=persistent://tenant/namespace/topic answers
 *   200 {"subscriptions":{"name":messages,...},
 *        "details":{"name":{"unacked":messages,"delayed":messages},...}}
 *   404 when the topic does not exist, 307 to the owner when another broker owns it,
 *   409 when an entry of the backlog has no index (written before the interceptor was on).
 *
 * Built by starlight_py/local/broker_plugin.py with the distribution's own jars (javac, no
 * Maven) into a NAR the local standalone and cluster brokers load.
 */
package io.starlight.broker;

import io.netty.buffer.ByteBuf;
import java.io.IOException;
import java.lang.reflect.Field;
import java.net.URL;
import java.util.ArrayList;
import java.util.BitSet;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.NavigableMap;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import javax.servlet.http.HttpServlet;
import javax.servlet.http.HttpServletRequest;
import javax.servlet.http.HttpServletResponse;
import org.apache.bookkeeper.mledger.AsyncCallbacks;
import org.apache.bookkeeper.mledger.Entry;
import org.apache.bookkeeper.mledger.ManagedCursor;
import org.apache.bookkeeper.mledger.ManagedLedgerException;
import org.apache.bookkeeper.mledger.Position;
import org.apache.bookkeeper.mledger.impl.ManagedCursorImpl;
import org.apache.bookkeeper.mledger.impl.ManagedLedgerImpl;
import org.apache.pulsar.broker.PulsarService;
import org.apache.pulsar.broker.intercept.ManagedLedgerInterceptorImpl;
import org.apache.pulsar.broker.namespace.LookupOptions;
import org.apache.pulsar.broker.service.Topic;
import org.apache.pulsar.broker.service.persistent.PersistentSubscription;
import org.apache.pulsar.broker.service.persistent.PersistentTopic;
import org.apache.pulsar.common.api.proto.BrokerEntryMetadata;
import org.apache.pulsar.common.api.proto.MessageMetadata;
import org.apache.pulsar.common.naming.TopicName;
import org.apache.pulsar.common.protocol.Commands;

public class MessageBacklogServlet extends HttpServlet {
    private static final long READ_TIMEOUT_SECONDS = 10;
    private static final int ATTEMPTS = 5;
    // What an entry says of its messages never changes (ledger ids are never reused): kept
    // across requests, so that counting a backlog again reads only the entries new to it.
    private static final int CACHE_LIMIT = 200_000;
    private static final Map<String, Indexed> CACHE = new ConcurrentHashMap<>();
    // Where each entry ends in the topic's message sequence (its last message's index + 1),
    // also learnt without reading the entry (lastThrough): a count whose mark-delete
    // position is known here reads no first entry.
    private static final Map<String, Long> THROUGH = new ConcurrentHashMap<>();

    private final transient PulsarService pulsar;
    private final transient Field batchDeletedIndexes;

    public MessageBacklogServlet(PulsarService pulsar) {
        this.pulsar = pulsar;
        Field field = null;
        try {
            field = ManagedCursorImpl.class.getDeclaredField("batchDeletedIndexes");
            field.setAccessible(true);
        } catch (ReflectiveOperationException | RuntimeException e) {
            field = null;
        }
        this.batchDeletedIndexes = field;
    }

    /** No index on an entry of the backlog: the count cannot be made from indexes. */
    static final class NoIndex extends Exception {
        NoIndex(String message) {
            super(message);
        }
    }

    /** The entries one request read, and the reads it started. */
    static final class Reads {
        final Map<Position, Indexed> done = new HashMap<>();
        final Map<Position, CompletableFuture<Indexed>> pending = new HashMap<>();
    }

    /** One entry's place in the topic's message sequence. */
    static final class Indexed {
        final long through; // messages of the topic up to and including this entry
        final int messages; // messages in this entry

        Indexed(long through, int messages) {
            this.through = through;
            this.messages = messages;
        }

        long before() {
            return through - messages;
        }
    }

    @Override
    protected void doGet(HttpServletRequest request, HttpServletResponse response)
            throws IOException {
        String path = request.getPathInfo();
        String name = request.getParameter("topic");
        if (path == null || !path.equals("/backlog") || name == null || name.isEmpty()) {
            send(response, 400, "{\"error\":\"GET backlog?topic=persistent://t/ns/topic\"}");
            return;
        }
        try {
            TopicName topicName = TopicName.get(name);
            Boolean owned = pulsar.getNamespaceService().isServiceUnitOwnedAsync(topicName)
                    .get(READ_TIMEOUT_SECONDS, TimeUnit.SECONDS);
            if (!owned) {
                Optional<URL> owner = pulsar.getNamespaceService()
                        .getWebServiceUrlAsync(topicName, LookupOptions.builder()
                                .authoritative(false).loadTopicsInBundle(false).build())
                        .get(READ_TIMEOUT_SECONDS, TimeUnit.SECONDS);
                URL here = new URL(pulsar.getWebServiceAddress());
                if (owner.isPresent() && !(owner.get().getHost().equals(here.getHost())
                        && owner.get().getPort() == here.getPort())) {
                    String target = owner.get().toString().replaceAll("/+$", "")
                            + request.getRequestURI() + "?" + request.getQueryString();
                    response.setHeader("Location", target);
                    send(response, 307, "{}");
                    return;
                }
            }
            Optional<Topic> found = pulsar.getBrokerService().getTopicIfExists(topicName.toString())
                    .get(READ_TIMEOUT_SECONDS, TimeUnit.SECONDS);
            if (found.isEmpty() || !(found.get() instanceof PersistentTopic)) {
                send(response, 404, "{\"error\":\"no such persistent topic\"}");
                return;
            }
            PersistentTopic topic = (PersistentTopic) found.get();
            ManagedLedgerImpl ledger = (ManagedLedgerImpl) topic.getManagedLedger();
            Reads read = new Reads();
            Map<String, Long> counts = new LinkedHashMap<>();
            for (Map.Entry<String, PersistentSubscription> subscription
                    : topic.getSubscriptions().entrySet()) {
                counts.put(subscription.getKey(),
                        messages(ledger, subscription.getValue().getCursor(), read));
            }
            StringBuilder body = new StringBuilder("{\"subscriptions\":{");
            boolean first = true;
            for (Map.Entry<String, Long> count : counts.entrySet()) {
                if (!first) {
                    body.append(',');
                }
                first = false;
                quote(body, count.getKey());
                body.append(':').append(count.getValue());
            }
            body.append("},\"details\":{");
            first = true;
            for (Map.Entry<String, PersistentSubscription> subscription
                    : topic.getSubscriptions().entrySet()) {
                if (!first) {
                    body.append(',');
                }
                first = false;
                quote(body, subscription.getKey());
                details(body, subscription.getValue());
            }
            body.append("}}");
            send(response, 200, body.toString());
        } catch (NoIndex e) {
            StringBuilder body = new StringBuilder("{\"error\":");
            quote(body, e.getMessage());
            send(response, 409, body.append('}').toString());
        } catch (Exception e) {
            StringBuilder body = new StringBuilder("{\"error\":");
            quote(body, String.valueOf(e));
            send(response, 500, body.append('}').toString());
        }
    }

    /** What a basic.get needs besides the backlog, as the topic's stats give it: the
     *  messages dispatched and unacknowledged (the consumers' sum) and the delayed ones the
     *  dispatcher tracks. One request then answers a get (the stats endpoint costs more). */
    private static void details(StringBuilder body, PersistentSubscription subscription) {
        long unacked = 0;
        for (org.apache.pulsar.broker.service.Consumer consumer : subscription.getConsumers()) {
            unacked += consumer.getUnackedMessages();
        }
        org.apache.pulsar.broker.service.Dispatcher dispatcher = subscription.getDispatcher();
        long delayed = dispatcher == null ? 0 : dispatcher.getNumberOfDelayedMessages();
        body.append(":{\"unacked\":").append(unacked)
                .append(",\"delayed\":").append(delayed).append('}');
    }

    /** The cursor's backlog in messages; retried while acknowledgements move it meanwhile. */
    private long messages(ManagedLedgerImpl ledger, ManagedCursor cursor,
            Reads read) throws Exception {
        if (!(cursor instanceof ManagedCursorImpl)) {
            throw new NoIndex("cursor " + cursor.getName() + " is not a managed cursor");
        }
        ManagedCursorImpl managed = (ManagedCursorImpl) cursor;
        for (int attempt = 1; ; attempt++) {
            Position markDelete = cursor.getMarkDeletedPosition();
            List<com.google.common.collect.Range<Position>> ranges =
                    new ArrayList<>(managed.getIndividuallyDeletedMessagesSet().asRanges());
            Map<Position, Integer> partial = partlyAcknowledged(cursor);
            if (markDelete.equals(cursor.getMarkDeletedPosition()) || attempt == ATTEMPTS) {
                return count(ledger, markDelete, ranges, partial, read);
            }
        }
    }

    private long count(ManagedLedgerImpl ledger, Position markDelete,
            List<com.google.common.collect.Range<Position>> ranges,
            Map<Position, Integer> partial, Reads read) throws Exception {
        Position confirmed = ledger.getLastConfirmedEntry();
        Position last = confirmed;
        if (last != null && last.getEntryId() < 0) {
            // A ledger just opened (after a roll-over or a reload) and still empty: the
            // last entry is the previous ledger's.
            last = ledger.getPreviousPosition(last);
        }
        Position first = ledger.getNextValidPosition(markDelete);
        if (last == null || first == null || last.getEntryId() < 0
                || first.compareTo(last) > 0) {
            return 0;
        }
        // The newest entry's index without reading it (a read of an entry just written
        // costs a few ms: basic.get counts after every publish), and the first entry's
        // start from the mark-delete entry's end when an earlier count learnt it.
        Long known = THROUGH.get(ledger.getName() + "|" + last);
        long lastThrough = known != null ? known
                : last.equals(confirmed) ? lastThrough(ledger, last) : -1;
        Long markThrough = THROUGH.get(ledger.getName() + "|" + markDelete);
        prefetch(ledger, markDelete, first, last, markThrough == null, lastThrough < 0,
                ranges, partial, read);
        if (lastThrough < 0) {
            lastThrough = indexed(ledger, last, read).through;
        }
        long messages = lastThrough
                - (markThrough != null ? markThrough : indexed(ledger, first, read).before());
        for (com.google.common.collect.Range<Position> range : ranges) {
            // (lower, upper]: entries acknowledged out of order, all after the mark-delete
            // position unless the cursor moved while this was read.
            Position upper = range.upperEndpoint();
            if (upper.compareTo(first) < 0) {
                continue;
            }
            if (upper.compareTo(last) > 0) {
                upper = last;
            }
            Position start = ledger.getNextValidPosition(range.lowerEndpoint());
            if (start.compareTo(first) < 0) {
                start = first;
            }
            if (start.compareTo(upper) > 0) {
                continue;
            }
            messages -= indexed(ledger, upper, read).through - indexed(ledger, start, read).before();
        }
        for (Map.Entry<Position, Integer> entry : partial.entrySet()) {
            Position position = entry.getKey();
            if (position.compareTo(first) < 0 || position.compareTo(last) > 0
                    || deleted(ranges, position)) {
                continue;
            }
            int total = indexed(ledger, position, read).messages;
            messages -= Math.max(0, total - entry.getValue());
        }
        return Math.max(0, messages);
    }

    /** The newest confirmed entry's end in the topic's message sequence from the index
     *  interceptor's counter; -1 when it cannot tell. Read on the managed ledger's own
     *  executor, which runs every add (the counter moves as an add starts) and every add's
     *  completion (the last confirmed entry moves as it ends) as whole tasks: with no add
     *  pending there, the counter is exactly the last confirmed entry's. */
    private static long lastThrough(ManagedLedgerImpl ledger, Position last) {
        if (!(ledger.getManagedLedgerInterceptor() instanceof ManagedLedgerInterceptorImpl)) {
            return -1;
        }
        ManagedLedgerInterceptorImpl interceptor =
                (ManagedLedgerInterceptorImpl) ledger.getManagedLedgerInterceptor();
        long through;
        try {
            through = CompletableFuture.supplyAsync(() -> {
                if (ledger.getPendingAddEntriesCount() != 0
                        || !last.equals(ledger.getLastConfirmedEntry())) {
                    return -1L;
                }
                long index = interceptor.getIndex();
                return index < 0 ? -1L : index + 1;
            }, ledger.getExecutor()).get(READ_TIMEOUT_SECONDS, TimeUnit.SECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            return -1;
        } catch (Exception e) {
            return -1; // a ledger closing (the topic moving): the entry is read instead
        }
        if (through > 0) {
            remember(ledger.getName() + "|" + last, through);
        }
        return through;
    }

    private static void remember(String key, long through) {
        if (THROUGH.size() >= CACHE_LIMIT) {
            THROUGH.clear();
        }
        THROUGH.put(key, through);
    }

    private static boolean deleted(List<com.google.common.collect.Range<Position>> ranges,
            Position position) {
        for (com.google.common.collect.Range<Position> range : ranges) {
            if (range.contains(position)) {
                return true;
            }
        }
        return false;
    }

    /** Entries some of whose batch messages are acknowledged: position -> messages left. */
    @SuppressWarnings("unchecked")
    private Map<Position, Integer> partlyAcknowledged(ManagedCursor cursor) throws Exception {
        Map<Position, Integer> left = new HashMap<>();
        if (batchDeletedIndexes == null || !(cursor instanceof ManagedCursorImpl)) {
            return left;
        }
        Object value = batchDeletedIndexes.get(cursor);
        if (!(value instanceof NavigableMap)) {
            return left;
        }
        for (Map.Entry<Position, BitSet> entry
                : ((NavigableMap<Position, BitSet>) value).entrySet()) {
            BitSet remaining = entry.getValue();
            synchronized (remaining) {
                left.put(entry.getKey(), remaining.cardinality());
            }
        }
        return left;
    }

    /** Starts reading, all at once, every entry `count` will look at. */
    private void prefetch(ManagedLedgerImpl ledger, Position markDelete, Position first,
            Position last, boolean readFirst, boolean readLast,
            List<com.google.common.collect.Range<Position>> ranges,
            Map<Position, Integer> partial, Reads read) {
        List<Position> wanted = new ArrayList<>();
        if (readFirst) {
            wanted.add(first);
        }
        if (readLast) {
            wanted.add(last);
        }
        for (com.google.common.collect.Range<Position> range : ranges) {
            Position upper = range.upperEndpoint();
            if (upper.compareTo(first) >= 0 && upper.compareTo(last) <= 0) {
                wanted.add(upper);
                wanted.add(ledger.getNextValidPosition(range.lowerEndpoint()));
            }
        }
        for (Position position : partial.keySet()) {
            if (position.compareTo(first) >= 0 && position.compareTo(last) <= 0) {
                wanted.add(position);
            }
        }
        for (Position position : wanted) {
            if (!read.done.containsKey(position) && !read.pending.containsKey(position)) {
                Indexed cached = CACHE.get(ledger.getName() + "|" + position);
                if (cached != null) {
                    read.done.put(position, cached);
                } else {
                    read.pending.put(position, startRead(ledger, position));
                }
            }
        }
    }

    private Indexed indexed(ManagedLedgerImpl ledger, Position position,
            Reads read) throws Exception {
        Indexed known = read.done.get(position);
        if (known != null) {
            return known;
        }
        String key = ledger.getName() + "|" + position;
        known = CACHE.get(key);
        if (known != null) {
            read.done.put(position, known);
            return known;
        }
        CompletableFuture<Indexed> future = read.pending.remove(position);
        if (future == null) {
            future = startRead(ledger, position);
        }
        try {
            Indexed found = future.get(READ_TIMEOUT_SECONDS, TimeUnit.SECONDS);
            read.done.put(position, found);
            if (CACHE.size() >= CACHE_LIMIT) {
                CACHE.clear();
            }
            CACHE.put(key, found);
            remember(key, found.through);
            return found;
        } catch (java.util.concurrent.ExecutionException e) {
            if (e.getCause() instanceof NoIndex) {
                throw (NoIndex) e.getCause();
            }
            throw e;
        }
    }

    private static CompletableFuture<Indexed> startRead(ManagedLedgerImpl ledger,
            Position position) {
        CompletableFuture<Indexed> future = new CompletableFuture<>();
        ledger.asyncReadEntry(position, new AsyncCallbacks.ReadEntryCallback() {
            @Override
            public void readEntryComplete(Entry entry, Object ctx) {
                try {
                    ByteBuf data = entry.getDataBuffer();
                    BrokerEntryMetadata broker = Commands.peekBrokerEntryMetadataIfExist(data);
                    if (broker == null || !broker.hasIndex()) {
                        future.completeExceptionally(new NoIndex("entry " + position
                                + " has no index (written before brokerEntryMetadataInterceptors"
                                + " had AppendIndexMetadataInterceptor)"));
                        return;
                    }
                    long through = broker.getIndex();
                    ByteBuf duplicate = data.duplicate();
                    Commands.skipBrokerEntryMetadataIfExist(duplicate);
                    MessageMetadata metadata = Commands.parseMessageMetadata(duplicate);
                    int messages = metadata.hasNumMessagesInBatch()
                            ? metadata.getNumMessagesInBatch() : 1;
                    // The index is that of the entry's last message, counted from 0.
                    future.complete(new Indexed(through + 1, messages));
                } catch (RuntimeException e) {
                    future.completeExceptionally(e);
                } finally {
                    entry.release();
                }
            }

            @Override
            public void readEntryFailed(ManagedLedgerException exception, Object ctx) {
                future.completeExceptionally(exception);
            }
        }, null);
        return future;
    }

    private static void quote(StringBuilder out, String text) {
        out.append('"');
        for (int i = 0; i < text.length(); i++) {
            char c = text.charAt(i);
            if (c == '"' || c == '\\') {
                out.append('\\').append(c);
            } else if (c < 0x20) {
                out.append(String.format("\\u%04x", (int) c));
            } else {
                out.append(c);
            }
        }
        out.append('"');
    }

    private static void send(HttpServletResponse response, int status, String body)
            throws IOException {
        response.setStatus(status);
        response.setContentType("application/json");
        response.setCharacterEncoding("UTF-8");
        response.getWriter().write(body);
    }
}
