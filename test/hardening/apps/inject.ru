# frozen_string_literal: true

# Hardening tests: an app that tries to put CR/LF into what the server writes.
EVIL = {
  "/value-crlf" => { "x-evil" => "a\r\nInjected: yes" },
  "/value-bare-cr" => { "x-evil" => "a\rInjected: yes" },
  "/value-nul" => { "x-evil" => "a\0b" },
  "/value-array-crlf" => { "x-evil" => ["ok", "b\r\nInjected: yes"] },
  "/name-crlf" => { "x-evil\r\nInjected" => "yes" },
  "/name-colon" => { "x-evil: yes\r\nInjected" => "yes" },
  "/name-space" => { "x evil" => "yes" },
  "/name-empty" => { "" => "yes" },
  "/content-length-junk" => { "content-length" => "1\r\nInjected: yes" }
}.freeze

run lambda { |env|
  path = env["PATH_INFO"]
  if (headers = EVIL[path])
    [200, headers, ["body"]]
  elsif path == "/status-1000"
    [1000, {}, ["x"]]
  elsif path == "/early-name-crlf"
    env["rack.early_hints"].call({ "x-hint\r\nInjected" => "yes" })
    [200, {}, ["after hints"]]
  elsif path == "/early-value-crlf"
    env["rack.early_hints"].call({ "link" => "</a.css>\r\nInjected: yes" })
    [200, {}, ["after hints"]]
  else
    [200, {}, ["fine"]]
  end
}
