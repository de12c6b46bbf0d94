# frozen_string_literal: true

# A classic Sinatra app run as `ruby sinatra_app.rb`: Sinatra starts the server it is told to.
require "sinatra"

set :server, "blackbuck"
set :bind, "127.0.0.1"
set :port, Integer(ENV.fetch("PORT"))
set :environment, :production

get("/") { "sinatra says hi\n" }
get("/hello/:name") { "hello #{params[:name]}\n" }
