; Inno Setup 6 script of the Iris Desktop installer for Windows (x64).
;
; Built by packaging/build.py on Windows, which passes the version and the paths:
;   ISCC.exe /DAppVersion=0.1.0 /DSourceDir=...\dist\iris-desktop /DOutputDir=...\dist
;            /DIconFile=...\build\icons\iris.ico packaging\windows\iris-desktop.iss
;
; Installs per user (no administrator rights, no UAC prompt) into
; %LOCALAPPDATA%\Programs\Iris Desktop, with a Start menu shortcut, an optional (checked)
; desktop shortcut, and an uninstaller in "Apps & features". The user's data (conversations,
; settings, logs in %LOCALAPPDATA%\iris-desktop) is kept on uninstall.

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
DefaultDirName={autopf}\{#AppName}
DefaultGroupName={#AppName}
DisableProgramGroupPage=yes
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
MinVersion=10.0
OutputDir={#OutputDir}
OutputBaseFilename=iris-desktop-{#AppVersion}-windows-x64-setup
SetupIconFile={#IconFile}
UninstallDisplayIcon={app}\{#AppExeName}
UninstallDisplayName={#AppName}
; the model (253 MB) does not compress; lzma2 still shrinks Qt, Python and numpy
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

[Icons]
; Start menu ({autoprograms} is the user's Programs folder with PrivilegesRequired=lowest)
Name: "{autoprograms}\{#AppName}"; Filename: "{app}\{#AppExeName}"; WorkingDir: "{app}"; Comment: "Offline, private chat with a local LLM"
; desktop (the user's desktop), unless unticked in the wizard
Name: "{autodesktop}\{#AppName}"; Filename: "{app}\{#AppExeName}"; WorkingDir: "{app}"; Tasks: desktopicon

[Run]
Filename: "{app}\{#AppExeName}"; Description: "{cm:LaunchProgram,{#AppName}}"; Flags: nowait postinstall skipifsilent

[UninstallDelete]
; files the app may write next to itself (none today); the user's data stays
Type: filesandordirs; Name: "{app}\_internal\__pycache__"
