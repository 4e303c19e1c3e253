// The mongodb service's healthcheck (docker-compose.yml), run by mongosh inside the container
// against the container's own address, every 10 s:
//   mongosh --quiet --norc "mongodb://$(hostname):27017/admin?directConnection=true&..." <this>
// It exits 0 only while this member is the writable primary of replica set rs0, and initiates the
// set the first time it finds the member without a configuration: once, since from then on the
// configuration is in the member's data (the volume), and a second run finds it.
//
// While the image's init scripts run, its temporary mongod listens on localhost only, without
// --replSet: the connection fails, so that phase is never healthy and initiates nothing.
// `hello` needs no login: a primary is answered without authenticating every 10 s. Initiating
// does: as root, the password read from the compose secret's file, as the image's own
// MONGO_INITDB_ROOT_PASSWORD_FILE names it (never on a command line).
const replicaSet = "rs0";
// The compose service's name: the address by which every client on the store network reaches
// the member, and the one the driver is told of (the store URL's replicaSet=rs0).
const member = "mongodb:27017";
const electionWaitMs = 5000;

function writablePrimary() {
  return db.hello().isWritablePrimary === true;
}

function rootPassword() {
  const file = process.env.MONGO_INITDB_ROOT_PASSWORD_FILE;
  if (!file) {
    throw new Error("MONGO_INITDB_ROOT_PASSWORD_FILE is not set");
  }
  return require("fs").readFileSync(file, "utf8").replace(/\n+$/, "");
}

// An admin command's reply: mongosh throws a failed command's error, the old shell returns it.
function command(admin, document) {
  try {
    return admin.runCommand(document);
  } catch (e) {
    return { ok: 0, code: e.code, codeName: e.codeName, errmsg: e.message };
  }
}

if (!writablePrimary()) {
  const admin = db.getSiblingDB("admin");
  const user = process.env.MONGO_INITDB_ROOT_USERNAME;
  if (!user) {
    throw new Error("MONGO_INITDB_ROOT_USERNAME is not set");
  }
  const login = admin.auth(user, rootPassword());
  if (!login || login.ok === 0) {
    throw new Error(`authentication as ${user} failed`);
  }
  const status = command(admin, { replSetGetStatus: 1 });
  if (status.code === 94 || status.codeName === "NotYetInitialized") {
    const config = { _id: replicaSet, members: [{ _id: 0, host: member }] };
    const reply = command(admin, { replSetInitiate: config });
    // AlreadyInitialized (23): an earlier check initiated it and was cut off by its timeout.
    if (reply.ok !== 1 && reply.code !== 23 && reply.codeName !== "AlreadyInitialized") {
      throw new Error(`replSetInitiate: ${reply.errmsg}`);
    }
    print(`initiated replica set ${replicaSet} with member ${member}`);
    // A one-member set elects itself within a few seconds.
    const deadline = Date.now() + electionWaitMs;
    while (!writablePrimary() && Date.now() < deadline) {
      sleep(250);
    }
  } else if (status.ok !== 1) {
    throw new Error(`replSetGetStatus: ${status.errmsg}`);
  }
}
const hello = db.hello();
if (hello.isWritablePrimary === true) {
  print(`${hello.me}: writable primary of ${hello.setName}`);
  quit(0);
} else {
  print(`${hello.me || "this member"}: not the writable primary (set ${hello.setName || "none"})`);
  quit(1);
}
