package lakesink.devtools;

import java.io.File;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hdfs.HdfsConfiguration;
import org.apache.hadoop.hdfs.MiniDFSCluster;

/**
 * A MiniDFSCluster (one NameNode, one DataNode, replication 1) on 127.0.0.1 for lakesink's
 * tests and demos: a real HDFS in one JVM. Started by devtools/hdfs.py.
 *
 * <p>Arguments: BASE_DIR [RPC_PORT [HTTP_PORT]] (ports 0 or absent: chosen free by the kernel).
 * Prints "READY hdfs://127.0.0.1:PORT HTTP_PORT" once the DataNode has registered, and shuts
 * the cluster down when its standard input reaches EOF (its parent went away).
 */
public final class MiniHdfs {
  private MiniHdfs() {}

  public static void main(String[] args) throws Exception {
    if (args.length < 1) {
      System.err.println("usage: MiniHdfs BASE_DIR [RPC_PORT [HTTP_PORT]]");
      System.exit(2);
    }
    int rpcPort = args.length > 1 ? Integer.parseInt(args[1]) : 0;
    int httpPort = args.length > 2 ? Integer.parseInt(args[2]) : 0;
    Configuration conf = new HdfsConfiguration();
    conf.set(MiniDFSCluster.HDFS_MINIDFS_BASEDIR, new File(args[0]).getAbsolutePath());
    conf.setInt("dfs.replication", 1);
    conf.set("dfs.namenode.http-address", "127.0.0.1:" + httpPort);
    conf.set("dfs.datanode.address", "127.0.0.1:0");
    conf.set("dfs.datanode.http.address", "127.0.0.1:0");
    conf.set("dfs.datanode.ipc.address", "127.0.0.1:0");
    conf.setBoolean("dfs.permissions.enabled", true);
    MiniDFSCluster cluster =
        new MiniDFSCluster.Builder(conf)
            .nameNodePort(rpcPort)
            .nameNodeHttpPort(httpPort)
            .numDataNodes(1)
            .format(true)
            .build();
    try {
      cluster.waitActive();
      int port = cluster.getNameNodePort();
      int http = cluster.getNameNode().getHttpAddress().getPort();
      System.out.println("READY hdfs://127.0.0.1:" + port + " " + http);
      System.out.flush();
      while (System.in.read() != -1) {
        // the parent holds our stdin open; EOF means it went away or asked us to stop
      }
    } finally {
      cluster.shutdown(true);
    }
    System.exit(0);
  }
}
