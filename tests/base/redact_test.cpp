// The redaction rule: names that look like secrets lose their values; command-line options too.
#include <gtest/gtest.h>

#include "oomflight/base/redact.hpp"

namespace oomflight {
namespace {

TEST(Redact, SecretLookingNames) {
  for (const char* name : {"WANDB_API_KEY", "HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "MYSQL_PASSWD",
                           "GOOGLE_APPLICATION_CREDENTIALS", "NCCL_IB_AUTH_TOKEN", "hf_token", "ssh_passphrase",
                           "SESSION_ID", "private_repo_url", "Cookie"}) {
    EXPECT_TRUE(looks_secret(name)) << name;
    EXPECT_EQ(redacted(name, "v"), "<redacted>") << name;
  }
  for (const char* name : {"CUDA_VISIBLE_DEVICES", "NCCL_DEBUG", "epoch", "learning_rate", "OOMFLIGHT_FOLDER"}) {
    EXPECT_FALSE(looks_secret(name)) << name;
    EXPECT_EQ(redacted(name, "v"), "v") << name;
  }
}

TEST(Redact, CommandLineOptions) {
  EXPECT_EQ(redacted_command_line({"python", "train.py", "--api-key=abc", "--lr", "0.1", "--auth-token", "xyz", "-k"}),
            "python train.py --api-key=<redacted> --lr 0.1 --auth-token <redacted> -k");
  EXPECT_EQ(redacted_command_line({"torchrun", "--nproc-per-node=8", "train.py"}), "torchrun --nproc-per-node=8 train.py");
  // Inside one argument: a shell prefix and a python -c script.
  EXPECT_EQ(redacted_command_line({"env", "HF_TOKEN=hf_abc", "python", "-c",
                                   "import w; w.init(api_key=\"s3cr3t\", epochs=3); run(token='t0k', x=1)"}),
            "env HF_TOKEN=<redacted> python -c import w; w.init(api_key=\"<redacted>\", epochs=3); "
            "run(token='<redacted>', x=1)");
}

TEST(Redact, UrlUserinfoInArgumentsAndValues) {
  EXPECT_EQ(redacted_command_line({"python", "train.py", "--db", "postgres://user:password@db.example:5432/runs",
                                   "--repo=https://user:ghp_token@github.com/org/repo.git"}),
            "python train.py --db postgres://<redacted>@db.example:5432/runs "
            "--repo=https://<redacted>@github.com/org/repo.git");
  EXPECT_EQ(redacted("DATABASE_URL", "mysql://root:hunter2@localhost/db"), "mysql://<redacted>@localhost/db");
  EXPECT_EQ(redacted("PIP_INDEX_URL", "https://__token__:pypi-abc@pypi.example/simple"),
            "https://<redacted>@pypi.example/simple");
  // The last '@' of the authority ends the userinfo (an '@' in a password); one after the path is the path's.
  EXPECT_EQ(redacted_urls("s3://a@b:c@bucket/key@v2 and http://host/x@y"), "s3://<redacted>@bucket/key@v2 and http://host/x@y");
  for (const char* plain : {"https://github.com/org/repo", "file:///tmp/x", "no url here", "a://", "://@"}) {
    EXPECT_EQ(redacted_urls(plain), plain) << plain;
  }
}

}  // namespace
}  // namespace oomflight
