package lakesink.devtools;

import java.io.BufferedReader;
import java.io.File;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hdfs.HdfsConfiguration;
import org.apache.hadoop.hdfs.MiniDFSCluster;

/**
 * A MiniDFSCluster (one NameNode; one DataNode and replication 1 unless {@code --datanodes}) on
 * 127.0.0.1 for lakesink's tests and demos: a real HDFS in one JVM. Started by devtools/hdfs.py.
 *
 * <p>Arguments: BASE_DIR [RPC_PORT [HTTP_PORT]] (ports 0 or absent: chosen free by the kernel),
 * then any number of {@code --datanodes N} (default 1; {@code dfs.replication} is set to N) and
 * {@code --conf KEY=VALUE} (a Hadoop key for the NameNode and DataNodes, set last, so it wins).
 * Prints "READY hdfs://127.0.0.1:PORT HTTP_PORT" once the DataNode has registered, and shuts
 * the cluster down when its standard input reaches EOF (its parent went away).
 *
 * <p>Commands on standard input, one a line, for fault tests; each answers "DONE COMMAND" (or
 * "FAILED COMMAND: reason") when it has taken effect:
 *
 * <ul>
 *   <li>{@code stop-datanode}: stop the (first) DataNode (with one, the cluster has none until restarted);
 *   <li>{@code start-datanode}: restart the stopped DataNode on its ports, wait for it;
 *   <li>{@code restart-namenode}: stop the NameNode and start it again on the same port, from
 *       its image and edit log (what it had committed), and wait until it is active.
 * </ul>
 */
public final class MiniHdfs {
  private MiniHdfs() {}

  public static void main(String[] args) throws Exception {
    List<String> positional = new ArrayList<>();
    Map<String, String> extra = new LinkedHashMap<>();
    int dataNodes = 1;
    for (int i = 0; i < args.length; i++) {
      if (args[i].equals("--datanodes") && i + 1 < args.length) {
        dataNodes = Integer.parseInt(args[++i]);
      } else if (args[i].equals("--conf") && i + 1 < args.length && args[i + 1].contains("=")) {
        String[] kv = args[++i].split("=", 2);
        extra.put(kv[0], kv[1]);
      } else {
        positional.add(args[i]);
      }
    }
    if (positional.isEmpty() || dataNodes < 1) {
      System.err.println(
          "usage: MiniHdfs BASE_DIR [RPC_PORT [HTTP_PORT]] [--datanodes N] [--conf KEY=VALUE]...");
      System.exit(2);
    }
    int rpcPort = positional.size() > 1 ? Integer.parseInt(positional.get(1)) : 0;
    int httpPort = positional.size() > 2 ? Integer.parseInt(positional.get(2)) : 0;
    Configuration conf = new HdfsConfiguration();
    conf.set(MiniDFSCluster.HDFS_MINIDFS_BASEDIR, new File(positional.get(0)).getAbsolutePath());
    conf.setInt("dfs.replication", dataNodes);
    conf.set("dfs.namenode.http-address", "127.0.0.1:" + httpPort);
    conf.set("dfs.datanode.address", "127.0.0.1:0");
    conf.set("dfs.datanode.http.address", "127.0.0.1:0");
    conf.set("dfs.datanode.ipc.address", "127.0.0.1:0");
    conf.setBoolean("dfs.permissions.enabled", true);
    for (Map.Entry<String, String> e : extra.entrySet()) {
      conf.set(e.getKey(), e.getValue());
    }
    MiniDFSCluster cluster =
        new MiniDFSCluster.Builder(conf)
            .nameNodePort(rpcPort)
            .nameNodeHttpPort(httpPort)
            .numDataNodes(dataNodes)
            .format(true)
            .build();
    try {
      cluster.waitActive();
      int port = cluster.getNameNodePort();
      int http = cluster.getNameNode().getHttpAddress().getPort();
      System.out.println("READY hdfs://127.0.0.1:" + port + " " + http);
      System.out.flush();
      BufferedReader in =
          new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
      MiniDFSCluster.DataNodeProperties stopped = null;
      String line;
      // the parent holds our stdin open; EOF means it went away or asked us to stop
      while ((line = in.readLine()) != null) {
        String command = line.trim();
        if (command.isEmpty()) {
          continue;
        }
        try {
          switch (command) {
            case "stop-datanode":
              if (stopped == null) {
                stopped = cluster.stopDataNode(0);
              }
              break;
            case "start-datanode":
              if (stopped != null) {
                cluster.restartDataNode(stopped, true);
                stopped = null;
                cluster.waitActive();
              }
              break;
            case "restart-namenode":
              cluster.restartNameNode(true);
              break;
            default:
              throw new IllegalArgumentException("unknown command");
          }
          System.out.println("DONE " + command);
        } catch (Exception e) {
          System.out.println("FAILED " + command + ": " + e);
        }
        System.out.flush();
      }
    } finally {
      cluster.shutdown(true);
    }
    System.exit(0);
  }
}
