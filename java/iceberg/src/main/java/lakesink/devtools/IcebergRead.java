package lakesink.devtools;

import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.hadoop.conf.Configuration;
import org.apache.iceberg.BaseTable;
import org.apache.iceberg.FileScanTask;
import org.apache.iceberg.Schema;
import org.apache.iceberg.Table;
import org.apache.iceberg.TableProperties;
import org.apache.iceberg.StaticTableOperations;
import org.apache.iceberg.TableScan;
import org.apache.iceberg.aws.s3.S3FileIO;
import org.apache.iceberg.data.IdentityPartitionConverters;
import org.apache.iceberg.data.Record;
import org.apache.iceberg.data.parquet.GenericParquetReaders;
import org.apache.iceberg.hadoop.HadoopTables;
import org.apache.iceberg.io.CloseableIterable;
import org.apache.iceberg.mapping.NameMapping;
import org.apache.iceberg.mapping.NameMappingParser;
import org.apache.iceberg.parquet.Parquet;
import org.apache.iceberg.util.PartitionUtil;

/**
 * Reads a lake's Iceberg view as Iceberg's own Java library does (issue 54), for the tests: the
 * table found from the lake's path by Iceberg's file-system catalog (HadoopTables: the version
 * hint, then probes above it), its scan planned by iceberg-core, and each data file read by
 * iceberg-parquet's generic reader as Iceberg's engine integrations (Spark, Flink) set it up:
 * the table's {@code schema.name-mapping.default} for files without field ids, identity
 * partition values as constants. (iceberg-data's {@code IcebergGenerics} leaves the name
 * mapping out, and Iceberg then falls back to ids by column position: see
 * docs/design/iceberg-view.md.)
 *
 * <p>Arguments: the lake's path, then any of {@code rows} (the ids of the current snapshot),
 * {@code rows:<snapshot id>}, {@code column:<name>} (each row's {@code <id>=<value>}, by id, at
 * the current snapshot), {@code column:<name>:<snapshot id>} (the same at that snapshot, read
 * with its schema), {@code appended:<from>:<to>} (the data files an incremental append scan
 * between two snapshots plans). One line per argument on stdout: {@code <arg> <snapshot id>
 * <values, sorted, comma-separated>}.
 *
 * <p>An {@code s3://} lake is read through iceberg-aws's {@code S3FileIO}, given the system
 * properties named {@code iceberg.<property>} as its properties ({@code s3.endpoint},
 * {@code s3.access-key-id}, ...): the metadata file the lake's version hint names, as a
 * file-system catalog finds it (HadoopTables reads {@code s3a://} only through Hadoop's S3A).
 */
public final class IcebergRead {
  public static void main(String[] args) throws Exception {
    Table table = args[0].startsWith("s3://") ? loadS3(args[0]) : new HadoopTables(new Configuration()).load(args[0]);
    String mappingJson = table.properties().get(TableProperties.DEFAULT_NAME_MAPPING);
    NameMapping mapping = mappingJson == null ? null : NameMappingParser.fromJson(mappingJson);
    for (int i = 1; i < args.length; i++) {
      String[] parts = args[i].split(":");
      List<String> out = new ArrayList<>();
      long snapshot;
      if (parts[0].equals("rows") || parts[0].equals("column")) {
        String column = parts[0].equals("column") ? parts[1] : "id";
        int at = parts[0].equals("rows") ? 1 : 2; // where a snapshot id is given
        snapshot = parts.length > at ? Long.parseLong(parts[at]) : table.currentSnapshot().snapshotId();
        TableScan scan = table.newScan().useSnapshot(snapshot).select("id", column);
        List<Record> records = read(table, scan, mapping);
        records.sort((a, b) -> Long.compare((Long) a.getField("id"), (Long) b.getField("id")));
        for (Record r : records) {
          out.add(parts[0].equals("rows") ? r.getField("id").toString() : r.getField("id") + "=" + r.getField(column));
        }
      } else if (parts[0].equals("appended")) {
        snapshot = Long.parseLong(parts[2]);
        try (CloseableIterable<FileScanTask> tasks =
            table
                .newIncrementalAppendScan()
                .fromSnapshotExclusive(Long.parseLong(parts[1]))
                .toSnapshot(snapshot)
                .planFiles()) {
          for (FileScanTask task : tasks) {
            out.add(task.file().location());
          }
        }
        Collections.sort(out);
      } else {
        throw new IllegalArgumentException("unknown request " + args[i]);
      }
      System.out.println(args[i] + " " + snapshot + " " + String.join(",", out));
    }
  }

  private static Table loadS3(String lake) throws Exception {
    Map<String, String> properties = new HashMap<>();
    for (String name : System.getProperties().stringPropertyNames()) {
      if (name.startsWith("iceberg.")) {
        properties.put(name.substring("iceberg.".length()), System.getProperty(name));
      }
    }
    S3FileIO io = new S3FileIO();
    io.initialize(properties);
    String hint;
    try (InputStream in = io.newInputFile(lake + "/metadata/version-hint.text").newStream()) {
      hint = new String(in.readAllBytes(), StandardCharsets.UTF_8).trim();
    }
    String metadata = lake + "/metadata/v" + Long.parseLong(hint) + ".metadata.json";
    return new BaseTable(new StaticTableOperations(metadata, io), lake);
  }

  private static List<Record> read(Table table, TableScan scan, NameMapping mapping) throws Exception {
    Schema projected = scan.schema();
    List<Record> records = new ArrayList<>();
    try (CloseableIterable<FileScanTask> tasks = scan.planFiles()) {
      for (FileScanTask task : tasks) {
        Map<Integer, ?> constants =
            PartitionUtil.constantsMap(task, IdentityPartitionConverters::convertConstant);
        Parquet.ReadBuilder builder =
            Parquet.read(table.io().newInputFile(task.file().location()))
                .project(projected)
                .split(task.start(), task.length())
                .createReaderFunc(
                    fileSchema -> GenericParquetReaders.buildReader(projected, fileSchema, constants));
        if (mapping != null) {
          builder = builder.withNameMapping(mapping);
        }
        try (CloseableIterable<Record> rows = builder.build()) {
          for (Record r : rows) {
            records.add(r.copy());
          }
        }
      }
    }
    return records;
  }
}
