package site.ycsb.db.pmhash;

import java.io.ByteArrayOutputStream;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.Vector;
import java.util.concurrent.atomic.AtomicLong;

import redis.clients.jedis.ClientSetInfoConfig;
import redis.clients.jedis.DefaultJedisClientConfig;
import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.Jedis;
import redis.clients.jedis.commands.ProtocolCommand;
import redis.clients.jedis.exceptions.JedisConnectionException;
import redis.clients.jedis.util.SafeEncoder;
import site.ycsb.ByteArrayByteIterator;
import site.ycsb.ByteIterator;
import site.ycsb.DB;
import site.ycsb.DBException;
import site.ycsb.Status;

/**
 * YCSB binding for {@code pmhash serve} (RESP2 over TCP, through Jedis).
 *
 * <p>YCSB creates one instance per client thread, so each instance owns one
 * connection. Properties:
 * <ul>
 *   <li>{@code pmhash.host} (default {@code 127.0.0.1})</li>
 *   <li>{@code pmhash.port} (default {@code 6379})</li>
 *   <li>{@code pmhash.timeout} socket timeout in ms (default {@code 10000})</li>
 * </ul>
 *
 * <p>Storage: a record is ONE value under the key {@code table + ":" + key},
 * encoded as {@link #encode}: for every field, in order,
 * {@code u32 name length (big-endian), name (UTF-8), u32 value length
 * (big-endian), value bytes}; nothing else (no header, no count). The empty
 * record is the empty string.
 *
 * <p>Operations: read = GET; insert = SET; update = GET, merge, SET (not
 * atomic against a concurrent update of the same key: the server has no
 * WATCH/MULTI; YCSB's workloads tolerate that like any read-modify-write);
 * delete = DEL; scan = {@code RANGE table:startkey table; LIMIT n} (";" is
 * the byte after ":", so the range stays inside the table's prefix).
 */
public class PmhashClient extends DB {
  public static final String HOST_PROPERTY = "pmhash.host";
  public static final String PORT_PROPERTY = "pmhash.port";
  public static final String TIMEOUT_PROPERTY = "pmhash.timeout";

  private static final ProtocolCommand RANGE = () -> SafeEncoder.encode("RANGE");
  private static final byte[] LIMIT = SafeEncoder.encode("LIMIT");

  /** Errors printed so far, over all threads (the first few only). */
  private static final AtomicLong ERRORS_PRINTED = new AtomicLong();
  private static final long MAX_ERRORS_PRINTED = 20;

  private String host;
  private int port;
  private int timeoutMs;
  private Jedis jedis;

  @Override
  public void init() throws DBException {
    Properties p = getProperties();
    host = p.getProperty(HOST_PROPERTY, "127.0.0.1");
    try {
      port = Integer.parseInt(p.getProperty(PORT_PROPERTY, "6379"));
      timeoutMs = Integer.parseInt(p.getProperty(TIMEOUT_PROPERTY, "10000"));
    } catch (NumberFormatException e) {
      throw new DBException("bad " + PORT_PROPERTY + " or " + TIMEOUT_PROPERTY + ": " + e.getMessage());
    }
    try {
      connect();
      jedis.ping();
    } catch (RuntimeException e) {
      throw new DBException("cannot reach pmhash at " + host + ":" + port + ": " + e, e);
    }
  }

  private void connect() {
    jedis = new Jedis(new HostAndPort(host, port),
        DefaultJedisClientConfig.builder()
            .connectionTimeoutMillis(timeoutMs)
            .socketTimeoutMillis(timeoutMs)
            // No CLIENT SETINFO on connect: twemproxy, in front of
            // several servers (docs/scale-out.md), does not forward CLIENT
            // and closes the connection instead.
            .clientSetInfoConfig(ClientSetInfoConfig.DISABLED)
            .build());
  }

  /** The connection, reopened if the last command broke it. */
  private Jedis conn() {
    if (jedis == null || jedis.isBroken() || !jedis.isConnected()) {
      if (jedis != null) {
        try {
          jedis.close();
        } catch (RuntimeException ignored) {
          // already broken
        }
      }
      connect();
    }
    return jedis;
  }

  @Override
  public void cleanup() throws DBException {
    if (jedis != null) {
      try {
        jedis.close();
      } catch (RuntimeException e) {
        throw new DBException(e);
      } finally {
        jedis = null;
      }
    }
  }

  private static byte[] dbKey(String table, String key) {
    return (table + ":" + key).getBytes(StandardCharsets.UTF_8);
  }

  private Status error(String op, String key, RuntimeException e) {
    if (ERRORS_PRINTED.incrementAndGet() <= MAX_ERRORS_PRINTED) {
      System.err.println("pmhash binding: " + op + " " + key + ": " + e);
    }
    if (e instanceof JedisConnectionException && jedis != null) {
      try {
        jedis.close();
      } catch (RuntimeException ignored) {
        // reconnect on the next call
      }
      jedis = null;
    }
    return Status.ERROR;
  }

  @Override
  public Status read(String table, String key, Set<String> fields, Map<String, ByteIterator> result) {
    try {
      byte[] v = conn().get(dbKey(table, key));
      if (v == null) {
        return Status.NOT_FOUND;
      }
      decodeInto(v, fields, result);
      return Status.OK;
    } catch (IllegalArgumentException e) {
      return error("read (corrupt record)", key, e);
    } catch (RuntimeException e) {
      return error("read", key, e);
    }
  }

  @Override
  public Status scan(String table, String startkey, int recordcount, Set<String> fields,
                     Vector<HashMap<String, ByteIterator>> result) {
    try {
      byte[] start = dbKey(table, startkey);
      byte[] end = (table + ";").getBytes(StandardCharsets.UTF_8);
      Object reply = conn().sendCommand(RANGE, start, end, LIMIT,
          SafeEncoder.encode(Integer.toString(Math.max(1, recordcount))));
      List<?> flat = (List<?>) reply;
      if (flat.size() % 2 != 0) {
        return error("scan", startkey, new IllegalStateException("RANGE reply of odd length " + flat.size()));
      }
      result.ensureCapacity(flat.size() / 2);
      for (int i = 0; i < flat.size(); i += 2) {
        HashMap<String, ByteIterator> row = new HashMap<>();
        decodeInto((byte[]) flat.get(i + 1), fields, row);
        result.add(row);
      }
      return Status.OK;
    } catch (RuntimeException e) {
      return error("scan", startkey, e);
    }
  }

  @Override
  public Status update(String table, String key, Map<String, ByteIterator> values) {
    try {
      byte[] k = dbKey(table, key);
      Jedis c = conn();
      byte[] old = c.get(k);
      if (old == null) {
        return Status.NOT_FOUND;
      }
      Map<String, byte[]> rec = decode(old);
      for (Map.Entry<String, ByteIterator> e : values.entrySet()) {
        rec.put(e.getKey(), e.getValue().toArray());
      }
      c.set(k, encode(rec));
      return Status.OK;
    } catch (RuntimeException e) {
      return error("update", key, e);
    }
  }

  @Override
  public Status insert(String table, String key, Map<String, ByteIterator> values) {
    try {
      Map<String, byte[]> rec = new LinkedHashMap<>();
      for (Map.Entry<String, ByteIterator> e : values.entrySet()) {
        rec.put(e.getKey(), e.getValue().toArray());
      }
      conn().set(dbKey(table, key), encode(rec));
      return Status.OK;
    } catch (RuntimeException e) {
      return error("insert", key, e);
    }
  }

  @Override
  public Status delete(String table, String key) {
    try {
      return conn().del(dbKey(table, key)) > 0 ? Status.OK : Status.NOT_FOUND;
    } catch (RuntimeException e) {
      return error("delete", key, e);
    }
  }

  // ---- record encoding -------------------------------------------------

  /**
   * Encodes a record: per field, {@code u32be len(name), name UTF-8,
   * u32be len(value), value}.
   */
  public static byte[] encode(Map<String, byte[]> rec) {
    int size = 0;
    for (Map.Entry<String, byte[]> e : rec.entrySet()) {
      size += 8 + e.getKey().length() * 3 + e.getValue().length;
    }
    ByteArrayOutputStream out = new ByteArrayOutputStream(size);
    for (Map.Entry<String, byte[]> e : rec.entrySet()) {
      byte[] name = e.getKey().getBytes(StandardCharsets.UTF_8);
      writeU32(out, name.length);
      out.write(name, 0, name.length);
      writeU32(out, e.getValue().length);
      out.write(e.getValue(), 0, e.getValue().length);
    }
    return out.toByteArray();
  }

  /** Decodes a whole record, keeping field order. */
  public static Map<String, byte[]> decode(byte[] buf) {
    Map<String, byte[]> rec = new LinkedHashMap<>();
    walk(buf, (name, v, off, len) -> {
      byte[] val = new byte[len];
      System.arraycopy(v, off, val, 0, len);
      rec.put(name, val);
    });
    return rec;
  }

  /** Puts the wanted fields (all when {@code fields} is null) into {@code out}. */
  static void decodeInto(byte[] buf, Set<String> fields, Map<String, ByteIterator> out) {
    walk(buf, (name, v, off, len) -> {
      if (fields == null || fields.contains(name)) {
        out.put(name, new ByteArrayByteIterator(v, off, len));
      }
    });
  }

  private interface FieldSink {
    void field(String name, byte[] buf, int off, int len);
  }

  private static void walk(byte[] buf, FieldSink sink) {
    int i = 0;
    while (i < buf.length) {
      int nl = readU32(buf, i);
      i += 4;
      if (nl < 0 || nl > buf.length - i) {
        throw new IllegalArgumentException("bad field name length " + nl + " at " + (i - 4));
      }
      String name = new String(buf, i, nl, StandardCharsets.UTF_8);
      i += nl;
      int vl = readU32(buf, i);
      i += 4;
      if (vl < 0 || vl > buf.length - i) {
        throw new IllegalArgumentException("bad value length " + vl + " at " + (i - 4));
      }
      sink.field(name, buf, i, vl);
      i += vl;
    }
  }

  private static void writeU32(ByteArrayOutputStream out, int v) {
    out.write(v >>> 24);
    out.write(v >>> 16);
    out.write(v >>> 8);
    out.write(v);
  }

  private static int readU32(byte[] b, int i) {
    if (i + 4 > b.length) {
      throw new IllegalArgumentException("truncated record at " + i);
    }
    return ((b[i] & 0xff) << 24) | ((b[i + 1] & 0xff) << 16) | ((b[i + 2] & 0xff) << 8) | (b[i + 3] & 0xff);
  }
}
