// A real WebSocket client (the `ws` package, Debian's node-ws) for the hijack tests.
//   node ws_echo.js URL echo   send "hello", expect "echo:hello", close, exit 0
//   node ws_echo.js URL hold   the same, then keep the socket open until the server closes it
// Prints one line per event; exits 1 on any error or unexpected message.
const WebSocket = require('ws');
const [url, mode] = process.argv.slice(2);
const ws = new WebSocket(url);
const fail = (why) => { console.log('error ' + why); process.exit(1); };
setTimeout(() => fail('timeout'), 20000).unref();
ws.on('open', () => ws.send('hello'));
ws.on('message', (data) => {
  if (String(data) !== 'echo:hello') fail('unexpected message ' + data);
  console.log('echoed');
  if (mode === 'hold') console.log('holding');
  else ws.close(1000);
});
ws.on('close', (code) => { console.log('closed ' + code); process.exit(0); });
ws.on('error', (e) => fail(e.message));
