// Apache Curator's lock recipes, driven line by line on stdin for lock-tests (tests/src/zookeeper.rs):
//   acquire <path> mutex|read|write <wait ms>   -> "ok acquired" | "ok busy"
//   release <path> mutex|read|write             -> "ok released"
//   children <path>                             -> "ok <name> <name> ..."
//   delete <path>                               -> "ok deleted" | "error …" (NoAuth, say)
// Arguments: the connect string, then optionally digest credentials (user:password) that the
// client adds to its session, as a service does with .authorization("digest", …).
// Each lock object is made once per (path, kind) and kept, as a service keeps its lock.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessLock;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.retry.ExponentialBackoffRetry;

public class CuratorLocks {
    public static void main(String[] args) throws Exception {
        CuratorFrameworkFactory.Builder builder = CuratorFrameworkFactory.builder()
                .connectString(args[0])
                .sessionTimeoutMs(10000)
                .connectionTimeoutMs(5000)
                .retryPolicy(new ExponentialBackoffRetry(100, 3));
        if (args.length > 1) {
            builder = builder.authorization("digest", args[1].getBytes(StandardCharsets.UTF_8));
        }
        CuratorFramework client = builder.build();
        client.start();
        client.blockUntilConnected(30, TimeUnit.SECONDS);
        Map<String, InterProcessMutex> mutexes = new HashMap<>();
        Map<String, InterProcessReadWriteLock> rw = new HashMap<>();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        System.out.println("ok ready");
        System.out.flush();
        String line;
        while ((line = in.readLine()) != null) {
            String[] words = line.trim().split(" ");
            try {
                switch (words[0]) {
                    case "acquire": {
                        InterProcessLock lock = lock(client, mutexes, rw, words[1], words[2]);
                        boolean got = lock.acquire(Long.parseLong(words[3]), TimeUnit.MILLISECONDS);
                        System.out.println(got ? "ok acquired" : "ok busy");
                        break;
                    }
                    case "release": {
                        lock(client, mutexes, rw, words[1], words[2]).release();
                        System.out.println("ok released");
                        break;
                    }
                    case "children": {
                        StringBuilder out = new StringBuilder("ok");
                        if (client.checkExists().forPath(words[1]) != null) {
                            List<String> children = client.getChildren().forPath(words[1]);
                            for (String child : children) {
                                out.append(' ').append(child);
                            }
                        }
                        System.out.println(out);
                        break;
                    }
                    case "delete": {
                        client.delete().forPath(words[1]);
                        System.out.println("ok deleted");
                        break;
                    }
                    default:
                        System.out.println("error unknown command " + words[0]);
                }
            } catch (Exception e) {
                System.out.println("error " + e.toString().replace('\n', ' '));
            }
            System.out.flush();
        }
        client.close();
    }

    static InterProcessLock lock(CuratorFramework client, Map<String, InterProcessMutex> mutexes,
            Map<String, InterProcessReadWriteLock> rw, String path, String kind) {
        switch (kind) {
            case "mutex":
                return mutexes.computeIfAbsent(path, p -> new InterProcessMutex(client, p));
            case "read":
                return rw.computeIfAbsent(path, p -> new InterProcessReadWriteLock(client, p)).readLock();
            case "write":
                return rw.computeIfAbsent(path, p -> new InterProcessReadWriteLock(client, p)).writeLock();
            default:
                throw new IllegalArgumentException("kind " + kind);
        }
    }
}
